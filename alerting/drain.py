"""Drain a host (issue 32, the ladder's last rungs kept simple): a ``drain_host`` action in
``apply`` mode goes to the operator's command or webhook, once per escalation.

The planner (``models.actions``) publishes a ``drain_host`` when an incident escalates to
``migrate_node`` / ``checkpoint_restart``, in ``apply`` mode only when the job's policy is
``auto`` and a drain command or webhook is configured; anything else is a dry run, which
``Drainer`` logs and never executes. The command is a template split like a shell line
(no shell runs it), ``{host}``, ``{job_id}``, ``{incident_id}`` and ``{reason}`` replaced
in each argument, e.g. ``scontrol update nodename={host} state=drain reason={reason}`` or
``kubectl cordon {host}``; the webhook receives the action as JSON. Each incident's
drain is executed at most once, whatever the redeliveries (the ids already executed are
kept in ``state_file`` when given, so a restart does not drain twice). A failing command
or endpoint is logged and counted, never raised: it must not stop the service feeding it.

>>> d = Drainer(command="echo drain {host}", runner=lambda argv, **kw: print(argv))
>>> d.handle({"kind": "action", "type": "drain_host", "mode": "apply", "host": "gpu-7",
...           "job_id": "j", "incident_id": "j:slow_rank:3:10", "reason": "gpu_errors"})
['echo', 'drain', 'gpu-7']
True
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("failslow.alerting.drain")
FIELDS = ("host", "job_id", "incident_id", "reason")


class Drainer:
    """command: the drain command template; webhook: a URL POSTed the action (JSON);
    timeout_s: per call; state_file: where executed incident ids persist; runner / post:
    the boundaries (``subprocess.run``, an HTTP POST), injected in tests."""

    def __init__(self, command: str | None = None, webhook: str | None = None,
                 timeout_s: float = 30.0, state_file: str | Path | None = None,
                 runner: Callable[..., Any] = subprocess.run,
                 post: Callable[[str, bytes, float], None] | None = None) -> None:
        self.argv = shlex.split(command) if command else None
        self.webhook = webhook
        self.timeout_s = timeout_s
        self.state_file = Path(state_file) if state_file else None
        self._run = runner
        self._post = post or _post
        self.done: set[str] = set()
        if self.state_file is not None and self.state_file.exists():
            self.done = set(self.state_file.read_text().split())
        self.stats = {"executed": 0, "dry_run": 0, "repeated": 0, "failed": 0}

    def handle(self, action: dict[str, Any]) -> bool:
        """Execute one action if it is a drain to apply that was not executed yet; True
        when it was executed (even if the command failed: it is not retried)."""
        if action.get("kind") != "action" or action.get("type") != "drain_host":
            return False
        if action.get("mode") != "apply" or not (self.argv or self.webhook):
            self.stats["dry_run"] += 1
            log.info("drain dry run: %s", action.get("reason"))
            return False
        key = str(action.get("incident_id"))
        if key in self.done:
            self.stats["repeated"] += 1
            return False
        self.done.add(key)
        if self.state_file is not None:
            with open(self.state_file, "a") as f:
                f.write(key + "\n")
        values = {k: str(action.get(k) or "") for k in FIELDS}
        if self.argv:
            argv = [arg.format(**values) for arg in self.argv]
            try:
                self._run(argv, timeout=self.timeout_s, check=True, capture_output=True)
            except (OSError, subprocess.SubprocessError) as exc:
                self.stats["failed"] += 1
                log.error("drain command for %s failed: %s", values["host"], exc)
        if self.webhook:
            try:
                self._post(self.webhook, orjson.dumps(action), self.timeout_s)
            except OSError as exc:
                self.stats["failed"] += 1
                log.error("drain webhook for %s failed: %s", values["host"], exc)
        self.stats["executed"] += 1
        return True


def run_drains(source: Any, drainer: Drainer, stop: Any, every_s: float = 0.2) -> None:
    """Hand every action ``source`` receives (a ``KafkaActionSource`` of every job) to
    ``drainer`` until ``stop`` (a threading.Event) is set; ``failslow notify`` runs it in a
    thread when a drain command or webhook is configured."""
    while not stop.wait(every_s):
        for action in source.poll():
            drainer.handle(action)


def _post(url: str, body: bytes, timeout_s: float) -> None:
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - operator's URL
        resp.read()
