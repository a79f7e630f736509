"""Where a rank's actions come from (issue 32), torch-free: the host agent and
``failslow notify`` use them too.

An action source's ``poll()`` never blocks. ``FileActionSource`` tails a JSON Lines file
(the one the host agent writes per job: the training process holds no broker
connection); ``KafkaActionSource`` runs a consumer of its own in a background thread;
``ActionRelay`` is the host agent's side, every job's actions to its file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from pathlib import Path
from typing import Any

import orjson

from failslow.schema.kafka_security import client_conf

log = logging.getLogger(__name__)


class FileActionSource:
    """New action events appended to a JSON Lines file; ``poll()`` reads what was added
    since the last call (a cut last line waits for its end). A missing file is no action."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._pos = 0
        self._tail = b""

    def poll(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size <= self._pos:
            return []
        with open(self.path, "rb") as f:
            f.seek(self._pos)
            data = f.read(size - self._pos)
        self._pos += len(data)
        data, self._tail = (self._tail + data).rsplit(b"\n", 1) if b"\n" in data \
            else (b"", self._tail + data)
        out = []
        for line in data.splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                obj = orjson.loads(line)
                if isinstance(obj, dict):
                    out.append(obj)
        return out


class KafkaActionSource:
    """A consumer of ``failslow.actions`` of its own, in a background thread; ``poll()``
    hands over what it received for ``job_id`` (the message key; None: every job) and
    never blocks."""

    def __init__(self, bootstrap: str, job_id: str | None, topic: str = "failslow.actions",
                 config: dict[str, Any] | None = None) -> None:
        from confluent_kafka import Consumer

        self.job_id, self.topic = job_id, topic
        self._q: deque[dict[str, Any]] = deque(maxlen=1024)
        self._stop = threading.Event()
        # no consumer group (no join to wait for, no offsets to commit): the thread assigns
        # itself every partition from the start and keeps its job's actions
        conf = client_conf(bootstrap, {"group.id": f"failslow-actions-{os.getpid()}",
                                       "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                                       "error_cb": lambda err: log.debug("actions: %s", err),
                                       **(config or {})})
        self._consumer = Consumer(conf)
        self._thread = threading.Thread(target=self._run, name="failslow-actions", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

        key = self.job_id.encode() if self.job_id is not None else None
        while not self._stop.is_set():
            try:
                meta = self._consumer.list_topics(self.topic, timeout=5).topics[self.topic]
                if meta.error is None and meta.partitions:
                    break
            except KafkaException:
                pass
            self._stop.wait(1.0)
        else:
            return
        self._consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING)
                               for p in meta.partitions])
        while not self._stop.is_set():
            msg = self._consumer.poll(0.2)
            if msg is None or msg.error() or (key is not None and msg.key() != key):
                continue
            raw = msg.value()
            with contextlib.suppress(orjson.JSONDecodeError, TypeError):
                value = orjson.loads(raw) if raw is not None else None
                self._q.extend(v for v in (value if isinstance(value, list) else [value])
                               if isinstance(v, dict))

    def poll(self) -> list[dict[str, Any]]:
        out = []
        while self._q:
            out.append(self._q.popleft())
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()


class ActionRelay:
    """The host agent's side: every action of ``source`` (a ``KafkaActionSource`` for all
    jobs) appended to ``folder/actions-<job_id>.jsonl``, which the job's ranks tail with a
    ``FileActionSource``: one broker connection per host, none in the training process.
    ``pump()`` moves what arrived (call it from the agent's loop); job ids that are not
    safe file names are skipped."""

    def __init__(self, source: Any, folder: str | os.PathLike) -> None:
        self.source = source
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.relayed = 0

    @staticmethod
    def path_for(folder: str | os.PathLike, job_id: str) -> Path:
        return Path(folder) / f"actions-{job_id}.jsonl"

    def pump(self) -> int:
        n = 0
        for a in self.source.poll():
            job = a.get("job_id")
            if not isinstance(job, str) or not job or "/" in job or job.startswith("."):
                continue
            with open(self.path_for(self.folder, job), "ab") as f:
                f.write(orjson.dumps(a) + b"\n")
            n += 1
        self.relayed += n
        return n

    def start(self, every_s: float = 0.1) -> ActionRelay:
        """Pump in a background thread every ``every_s`` seconds until ``stop()``."""
        self._halt = threading.Event()

        def loop() -> None:
            while not self._halt.wait(every_s):
                try:
                    self.pump()
                except OSError as exc:  # a full disk must not stop the agent
                    log.warning("actions relay: %s", exc)

        self._thread = threading.Thread(target=loop, name="failslow-actions-relay", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if getattr(self, "_thread", None) is not None:
            self._halt.set()
            self._thread.join()
        self.pump()
        close = getattr(self.source, "close", None)
        if close is not None:
            close()
