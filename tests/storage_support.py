"""Helpers for the storage tests (imported by tests/test_storage_*.py).

chdb opens ONE data folder per process (and one process per folder). So every
in-process test shares one folder for the whole pytest run, created lazily here,
and isolates itself with its own database ``failslow_<uuid>``; tests that need
a folder of their own (CLI commands, a second process) run in a subprocess.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from failslow.schema.events import NESTED, SPECS
from failslow.storage.client import Client, connect
from failslow.storage.migrations import migrate

_folder: list[Path] = []
_keeper: list[Client] = []  # one open client keeps the session up between tests


def shared_folder() -> Path:
    """The chdb folder this pytest process uses (created once, removed at exit)."""
    if not _folder:
        path = Path(tempfile.mkdtemp(prefix="failslow-chdb-")) / "chdb"
        _folder.append(path)
        _keeper.append(connect(f"chdb://{path}", own=True))
        atexit.register(_cleanup, path.parent)
    return _folder[0]


def _cleanup(root: Path) -> None:
    # Close the session before its folder goes: chdb crashes at exit on a deleted folder.
    for client in _keeper:
        client.close()
    shutil.rmtree(root, ignore_errors=True)


def chdb_url(database: str) -> str:
    return f"chdb://{shared_folder()}?database={database}"


@pytest.fixture
def ch() -> Iterator[Client]:
    """A migrated, empty database of its own in the shared chdb folder."""
    database = f"failslow_{uuid.uuid4().hex[:12]}"
    client = connect(chdb_url(database), own=True)
    migrate(client)
    try:
        yield client
    finally:
        client.execute(f"DROP DATABASE IF EXISTS {database}")
        client.close()


def _value(name: str, ftype: Any, i: int, full: bool = True) -> Any:
    if name == "ts" or name.endswith("_ts"):
        return 1_700_000_000.25 + i
    if ftype == "num":
        return 1.5 + i
    if ftype in ("int", "i32"):
        return 3 + i
    if ftype == "str":
        return f"{name}-{i}"
    if ftype == "ints":
        return [13, 79 + i]
    if ftype == "nums":
        return [0.25, 0.75 + i]
    if ftype == "obj":
        return {"z": 2.5, "i": i}
    if ftype == "bool":
        return i % 2 == 0
    if ftype in NESTED:  # one entry, all its fields or the required (min_s == max_s)
        required, optional = NESTED[ftype]
        return [{n: _value(n, t, i) for n, t in {**required, **(optional if full else {})}.items()}]
    return ftype[i % len(ftype)]


def full_event(kind: str, i: int = 0) -> dict[str, Any]:
    """An event of ``kind`` with EVERY field of CONTRACT.md set (required and optional)."""
    required, optional = SPECS[kind]
    event: dict[str, Any] = {"v": 1, "kind": kind}
    for name, ftype in {**required, **optional}.items():
        event[name] = _value(name, ftype, i)
    return event


def minimal_event(kind: str, i: int = 0) -> dict[str, Any]:
    """An event of ``kind`` with only the required fields."""
    required, _ = SPECS[kind]
    return {"v": 1, "kind": kind, **{n: _value(n, t, i, False) for n, t in required.items()}}
