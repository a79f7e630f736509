"""bench/streams_latency.py with several workers in one consumer group: detection latency
of a live job (one job: its detection runs on its home partition, the other workers
route) at about half of the sustained rate.

    .venv/bin/python bench/streams_latency_workers.py [--workers 2] [streams_latency.py flags]

Everything but ``--workers`` goes to bench/streams_latency.py unchanged. The pipeline
histogram it prints is the first worker's. Writes
bench/results/streams_latency_<N>workers[_step<S>s].json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import streams_latency as sl  # noqa: I001 - bench/ is on sys.path

from failslow.stack import free_port
from failslow.worker_process import WorkerProcess

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    args, rest = ap.parse_known_args()
    n = args.workers

    class Workers:
        """``n`` workers in the group; the first serves the metrics streams_latency reads."""

        def __init__(self, bootstrap, topics, group, metrics_port, extra, log_path):
            self.workers = [WorkerProcess(bootstrap, topics, group=group,
                                          metrics_port=metrics_port if i == 0 else free_port(),
                                          extra=extra, log_path=log_path) for i in range(n)]
            self.proc = self.workers[0].proc

        def stop(self) -> int:
            return max(w.stop() for w in self.workers)

    sl.WorkerProcess = Workers  # type: ignore[assignment,misc]
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        sl.RESULTS = Path(tmp)
        sys.argv = [sys.argv[0], *rest]
        sl.main()
        for f in Path(tmp).glob("*.json"):
            RESULTS.mkdir(exist_ok=True)
            res = json.loads(f.read_text())
            res.update(workers=n, loadavg_before=load0, loadavg_after=os.getloadavg())
            dest = RESULTS / f.name.replace("streams_latency", f"streams_latency_{n}workers")
            dest.write_text(json.dumps(res, indent=2))
            print(f"wrote {dest}")


if __name__ == "__main__":
    main()
