"""`failslow report`: one incident (INCIDENT_ID) or one job (--job JOB) as a self-contained
HTML page (inline SVG plots and CSS, no script, nothing fetched when it is opened), read
from the configured ClickHouse, or straight from trace files (--trace): the detector runs
offline as `failslow detect` does and the events go to a scratch chdb folder that is
deleted afterwards, so no database is set up or touched. Rendering: storage.report.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from failslow.errors import ConfigError

if TYPE_CHECKING:
    from failslow.models.pipeline import Detector

HELP = "one incident or one job as a self-contained HTML page with plots"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("incident_id", nargs="?", metavar="INCIDENT_ID",
                        help="the incident to show (its incident_id; `failslow detect "
                        "--format text` ends each line with it)")
    parser.add_argument("--job", metavar="JOB", help="show a job instead: its incidents and "
                        "its step times, culprits highlighted")
    parser.add_argument("--trace", nargs="+", metavar="FILE",
                        help="read these JSON Lines traces (one per rank is fine: merged by "
                        "ts) instead of ClickHouse, and detect in them as `failslow detect` "
                        "does; without INCIDENT_ID or --job: the page of the trace's job")
    parser.add_argument("--out", type=Path, metavar="FILE",
                        help="write the page here [failslow-report-<id>.html in the current "
                        "folder]; - writes it to stdout")


def _default_name(key: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    return Path(f"failslow-report-{safe}.html")


def run(args: argparse.Namespace) -> int:
    if args.incident_id and args.job:
        raise ConfigError("give one INCIDENT_ID or --job JOB")
    if args.trace:
        page, key = _from_traces(args)
    else:
        if not (args.incident_id or args.job):
            raise ConfigError("give one INCIDENT_ID or --job JOB (or --trace FILE...)")
        page, key = _from_clickhouse(args)
    out = args.out or _default_name(key)
    if str(out) == "-":
        sys.stdout.write(page)
        return 0
    try:
        out.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--out {out}: {exc.strerror or exc}") from None
    print(f"failslow report: wrote {out} ({len(page.encode()) / 1024:.0f} KiB)", file=sys.stderr)
    return 0


def _from_clickhouse(args: argparse.Namespace) -> tuple[str, str]:
    from failslow.config import clickhouse_url, resolve
    from failslow.storage.client import connect

    client = connect(clickhouse_url(resolve(args)))
    try:
        return _render(client, args.incident_id, args.job)
    finally:
        client.close()


def _render(client: Any, incident_id: str | None, job: str | None) -> tuple[str, str]:
    from failslow.storage.report import incident_page, job_page

    if job:
        return job_page(client, job), f"job-{job}"
    assert incident_id is not None
    return incident_page(client, incident_id), incident_id


def _from_traces(args: argparse.Namespace) -> tuple[str, str]:
    from failslow.storage.client import connect
    from failslow.storage.migrations import migrate

    scratch = Path(tempfile.mkdtemp(prefix="failslow-report-"))
    try:
        client = connect(f"chdb://{scratch / 'chdb'}", own=True)
        try:
            migrate(client)
            jobs = load_traces(client, args.trace, hint=not args.incident_id)
            job = args.job
            if not args.incident_id and not job:
                if len(jobs) != 1:
                    raise ConfigError(f"the traces hold {len(jobs)} jobs ({', '.join(jobs)}): "
                                      "give --job JOB or an INCIDENT_ID")
                job = jobs[0]
            return _render(client, args.incident_id, job)
        finally:
            client.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class _Recorder:
    """The offline detector, with every event it judges also written to ClickHouse (the
    page's charts read the events back from there)."""

    def __init__(self, det: Any, writer: Any) -> None:
        self.det, self.writer = det, writer
        self.incidents: list[dict] = []
        self.jobs: dict[str, None] = {}

    def process_batch(self, batch: list[dict]) -> list[dict]:
        for ev in batch:
            if not self.writer.add(ev):
                self.writer.flush()
                self.writer.add(ev)
            job = ev.get("job_id")
            if job is not None and job not in self.jobs:
                self.jobs[job] = None
        return self._keep(self.det.process_batch(batch))

    def flush(self) -> list[dict]:
        return self._keep(self.det.flush())

    def end_jobs(self) -> list[dict]:
        return self._keep(self.det.end_jobs())

    def _keep(self, incidents: list[dict]) -> list[dict]:
        self.incidents += incidents
        return incidents


def load_traces(client: Any, files: list[str], hint: bool = False) -> list[str]:
    """Detect in ``files`` (merged by ts, as `failslow detect` reads them) and write their
    events and incidents to ``client``; the job ids seen, in order of appearance."""
    from failslow.commands.detect import DetectError, detect_sources
    from failslow.commands.replay import REORDER_WINDOW
    from failslow.models.shard import ShardedDetector
    from failslow.storage.writer import Writer

    writer = Writer(client)
    rec = _Recorder(ShardedDetector(), writer)
    warned = 0

    def warn(src: int, no: int, reason: str) -> None:
        nonlocal warned
        warned += 1
        if warned <= 5:
            print(f"failslow report: {files[src]} line {no}: {reason} (skipped)",
                  file=sys.stderr)

    with ExitStack() as stack:
        try:
            sources: list[Iterable[bytes]] = [stack.enter_context(Path(f).open("rb"))
                                              for f in files]
        except OSError as exc:
            # `--trace` takes every word after it: an id written there reads as a file
            tip = "; an INCIDENT_ID goes before --trace" if hint else ""
            raise DetectError(f"cannot read {exc.filename}: {exc.strerror}{tip}") from None
        # the recorder answers what detect_sources asks of a Detector
        n_events, n_bad, _ = detect_sources(sources, cast("Detector", rec), lambda _inc: None,
                                            warn, REORDER_WINDOW)
    if n_events == 0:
        raise DetectError(f"no valid event in {', '.join(files)}")
    writer.write(rec.incidents)
    writer.flush()
    print(f"failslow report: {n_events} events, {n_bad} invalid line(s) skipped, "
          f"{len({i['incident_id'] for i in rec.incidents})} incident(s)", file=sys.stderr)
    return list(rec.jobs)
