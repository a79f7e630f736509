"""The durable outbox: undelivered notifications and the de-duplication state, in SQLite.

Every notification is written here (together with the incident states that
caused it, in one transaction) before the Kafka offset of its incident is
committed, and deleted only once its endpoint accepted it. So a crash, a
restart or an endpoint that is down for hours loses nothing; at worst a
notification is delivered twice (at-least-once). Rows of one destination are
delivered in id order: a resolve never overtakes its trigger.

Only incident data is stored, never an endpoint's URL or key.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

import orjson

from failslow.alerting.base import AlertingError, Notification
from failslow.alerting.router import IncidentState

SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    destination TEXT NOT NULL,
    action TEXT NOT NULL,
    event BLOB NOT NULL,
    created_ts REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_ts REAL NOT NULL DEFAULT 0,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS outbox_dest ON outbox (destination, id);
CREATE TABLE IF NOT EXISTS incidents (
    incident_id TEXT PRIMARY KEY,
    state BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS rejected (
    id INTEGER PRIMARY KEY,
    destination TEXT NOT NULL,
    action TEXT NOT NULL,
    event BLOB NOT NULL,
    rejected_ts REAL NOT NULL,
    reason TEXT NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Head:
    """The oldest undelivered row of a destination: when it may be tried again."""

    key: int
    attempts: int
    next_ts: float


class Outbox:
    """One SQLite file (``notify.sqlite`` under the state directory); one thread uses it.

    A write that fails later (disk full) raises sqlite3.Error on purpose: the caller
    must stop rather than commit Kafka offsets for notifications it could not store.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None)
            # WAL + FULL: a committed write survives a crash or power loss before we
            # commit the Kafka offset that it stands for.
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise AlertingError(f"outbox {path}: {exc}") from None

    def close(self) -> None:
        self._db.close()

    def load_incidents(self) -> dict[str, IncidentState]:
        rows = self._db.execute("SELECT incident_id, state FROM incidents").fetchall()
        return {iid: IncidentState.from_dict(orjson.loads(s)) for iid, s in rows}

    def record(self, notes: list[Notification], states: dict[str, IncidentState],
               now: float, forget: list[str] | tuple[str, ...] = ()) -> int:
        """Store notifications and incident states atomically; returns the rows added."""
        if not notes and not states and not forget:
            return 0
        with self._tx():
            self._db.executemany(
                "INSERT INTO outbox (destination, action, event, created_ts, next_ts) "
                "VALUES (?, ?, ?, ?, 0)",
                [(n.destination, n.action, orjson.dumps(n.event), now) for n in notes])
            self._db.executemany(
                "INSERT OR REPLACE INTO incidents (incident_id, state) VALUES (?, ?)",
                [(iid, orjson.dumps(s.to_dict())) for iid, s in states.items()])
            self._db.executemany("DELETE FROM incidents WHERE incident_id = ?",
                                 [(iid,) for iid in forget])
        return len(notes)

    def destinations(self) -> list[str]:
        """Destinations with something undelivered."""
        return [r[0] for r in self._db.execute("SELECT DISTINCT destination FROM outbox")]

    def head(self, destination: str) -> Head | None:
        row = self._db.execute(
            "SELECT id, attempts, next_ts FROM outbox WHERE destination = ? ORDER BY id LIMIT 1",
            (destination,)).fetchone()
        return Head(*row) if row else None

    def batch(self, destination: str, limit: int) -> list[Notification]:
        """The oldest ``limit`` undelivered notifications of a destination, in order."""
        rows = self._db.execute(
            "SELECT id, action, event FROM outbox WHERE destination = ? ORDER BY id LIMIT ?",
            (destination, limit)).fetchall()
        return [Notification(destination, a, orjson.loads(e), key) for key, a, e in rows]

    def delivered(self, keys: list[int]) -> None:
        with self._tx():
            self._db.executemany("DELETE FROM outbox WHERE id = ?", [(k,) for k in keys])

    def reject(self, key: int, reason: str, now: float) -> None:
        """Move a row the endpoint refused for good to ``rejected`` (kept for the operator)."""
        with self._tx():
            self._db.execute(
                "INSERT INTO rejected (id, destination, action, event, rejected_ts, reason) "
                "SELECT id, destination, action, event, ?, ? FROM outbox WHERE id = ?",
                (now, reason, key))
            self._db.execute("DELETE FROM outbox WHERE id = ?", (key,))

    def defer(self, key: int, attempts: int, next_ts: float, error: str | None) -> None:
        """Record a failed attempt on a destination's head row and when to try again."""
        self._db.execute("UPDATE outbox SET attempts = ?, next_ts = ?, last_error = ? "
                         "WHERE id = ?", (attempts, next_ts, error, key))

    def pending(self, destination: str | None = None) -> int:
        if destination is None:
            return int(self._db.execute("SELECT count(*) FROM outbox").fetchone()[0])
        return int(self._db.execute("SELECT count(*) FROM outbox WHERE destination = ?",
                                    (destination,)).fetchone()[0])

    def rejected_count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM rejected").fetchone()[0])

    def _tx(self) -> _Tx:
        return _Tx(self._db)


class _Tx:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on an exception."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
