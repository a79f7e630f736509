"""bench/streams_latency.py with several workers in one consumer group: detection latency
of a live job (one job: its detection runs on its home partition, the other workers
route) at about half of the sustained rate.

    .venv/bin/python bench/streams_latency_workers.py [--workers 2] [streams_latency.py flags]

Everything but ``--workers`` goes to bench/streams_latency.py unchanged. The pipeline
histogram it prints is the first worker's. Writes
bench/results/streams_latency_<N>workers[_step<S>s].json.

``--sharded`` (issue 16): a job cut into shards, judged by the workers together, at half
of their sustained rate measured in the same run:

    .venv/bin/python bench/streams_latency_workers.py --sharded [--ranks 1024] [--shard-ranks 512]

1. ``FAILSLOW_SHARD_RANKS`` is set to ``--shard-ranks`` (for the workers this process
   starts), so a ``--ranks`` job spans ranks / shard-ranks shards (default 2 shards of 512:
   a 4,096-rank shard's job, live, would need more than this 2-core VM);
2. the workers' sustained rate on that job (tp8 pp8, comm grain, 1 s steps,
   ``--rate-steps`` steps published as a backlog: bench/streams_shards.py's ``run``) in
   judged rank-steps per wall second, first event processed to last step judged;
3. the live job of the same size is published at the step time that makes its rank-steps/s
   half of that rate, with ``--faults`` GPU fail-slows spread over its shards (one after
   the other), and the latency of each (first slowed event published -> its incident on
   the incidents topic) is bench/streams_latency.py's, against the target
   2.5 step times + 1 s (p99).

Each run is appended to bench/results/streams_latency_sharded.json, with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if __name__ == "__main__" and "--sharded" in sys.argv:
    # models.shard reads it on import: before anything imports it (the workers inherit it)
    _i = sys.argv.index("--shard-ranks") if "--shard-ranks" in sys.argv else -1
    os.environ["FAILSLOW_SHARD_RANKS"] = sys.argv[_i + 1] if _i >= 0 else "512"

import streams_latency as sl  # noqa: I001,E402 - bench/ is on sys.path

from streams_throughput import cpu_seconds  # noqa: E402

from failslow.stack import free_port  # noqa: E402
from failslow.worker_process import WorkerProcess  # noqa: E402

from failslow.simulator import Scenario  # noqa: E402

RESULTS = Path(__file__).parent / "results"
WORKER_CPU: dict[str, Any] = {}   # each worker's CPU s per wall s over the live run


def spread_scenario(ranks: int) -> Callable[[int, int, float], Scenario]:
    """bench/streams_latency.py's scenario for steps under 2 s, at any step time (faults
    of 10 s, one every 15 s from 20 s on: at 2 s steps and more its other scenario's
    2-step faults are missed by `failslow detect` too), with the culprits spread over the
    shards: fault ``i`` on a rank of shard ``i % shards`` (streams_latency's sit low)."""
    from failslow.models.shard import SHARD_RANKS, shards_of
    from failslow.simulator import FaultSpec, JobSpec

    def scenario(hosts: int, faults: int, step_s: float) -> Scenario:
        n = shards_of(ranks, SHARD_RANKS)
        specs = tuple(FaultSpec(kind="gpu_thermal", start_s=20 + 15 * i, end_s=30 + 15 * i,
                                intensity=0.3, job="lat",
                                rank=((i % n) * SHARD_RANKS + 37 * i + 5) % ranks)
                      for i in range(faults))
        return Scenario(name="latency_sharded",
                        description=f"sequential GPU fail-slows spread over {n} shards",
                        jobs=(JobSpec(job_id="lat", hosts=hosts, tp=8, pp=8, micro_batches=8,
                                      step_s=step_s),),
                        faults=specs, steps=int((35 + 15 * faults) / step_s))
    return scenario


class SharedBroker:
    """The broker of this run, handed to streams_latency (which would stop its own)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.bootstrap = broker.bootstrap

    def stop(self, *_: Any) -> None:
        pass


def sustained_rate(broker: Any, ranks: int, steps: int, n_workers: int,
                   extra: list[str]) -> dict:
    """The workers' sustained judged rank-steps/s on a ``ranks`` job (streams_shards)."""
    import streams_shards as ss
    import streams_throughput as st

    from failslow.schema import Topics
    from failslow.simulator import simulate
    from failslow.stack import create_topics

    events = list(simulate(st.scenario(1, ranks), seed=0, steps=steps).events())
    n_steps = len({e["step"] for e in events if e["kind"] == "step"})
    topics = Topics(f"r{uuid.uuid4().hex[:8]}.")
    create_topics(broker.bootstrap, topics, partitions=4)
    r = ss.run(broker.bootstrap, topics, events, n_steps * ranks, n_workers, 600.0, 12.0,
               extra)
    return r


def main_sharded(argv: list[str]) -> None:
    from failslow.models.shard import SHARD_RANKS, shards_of

    ap = argparse.ArgumentParser(description="--sharded: " + __doc__.splitlines()[0])
    ap.add_argument("--sharded", action="store_true")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--shard-ranks", type=int, default=512)
    ap.add_argument("--rate-steps", type=int, default=40,
                    help="steps of the backlog that measures the sustained rate")
    ap.add_argument("--load", type=float, default=0.5,
                    help="the live job's rank-steps/s as a share of the sustained rate")
    ap.add_argument("--faults", type=int, default=6)
    ap.add_argument("--worker-args", default="--session-timeout 10")
    args = ap.parse_args(argv)
    assert SHARD_RANKS == args.shard_ranks, (SHARD_RANKS, args.shard_ranks)
    n, shards = args.workers, shards_of(args.ranks, SHARD_RANKS)
    load0 = os.getloadavg()
    print(f"{args.ranks:,}-rank job in {shards} shards of {SHARD_RANKS} "
          f"(FAILSLOW_SHARD_RANKS), {n} workers; load {load0}", flush=True)
    broker = sl.start_broker()
    try:
        rate = sustained_rate(broker, args.ranks, args.rate_steps, n,
                              args.worker_args.split())
        wall = rate["judged_rank_steps_per_s_wall"]
        print(f"sustained: {rate['judged_rank_steps']:,.0f} rank-steps judged in "
              f"{rate['seconds_to_last_judged']:.1f} s = {wall:,.0f}/s wall (worker CPU "
              f"{[round(c, 1) for c in rate['worker_cpu_s']]} s; until every event was "
              f"processed: {rate['judged_rank_steps_per_s_wall_until_all_processed']:,.0f}/s)",
              flush=True)
        if not wall or rate["judged_rank_steps"] < rate["expected_rank_steps"]:
            raise SystemExit(f"the sustained run did not judge every step: {rate}")
        step_s = round(args.ranks / (args.load * wall), 3)
        bound = 2.5 * step_s + 1.0
        print(f"live job: {args.ranks:,} ranks at {step_s} s steps = "
              f"{args.ranks / step_s:,.0f} rank-steps/s ({args.load:.0%} of sustained); "
              f"target p99 <= 2.5 x {step_s} + 1 = {bound:.2f} s", flush=True)
        sl.start_broker = lambda: SharedBroker(broker)  # type: ignore[assignment,return-value]
        sl.scenario = spread_scenario(args.ranks)  # type: ignore[assignment]
        res = run_workers(n, ["--hosts", str(args.ranks // 8), "--faults", str(args.faults),
                              "--step-s", str(step_s), "--worker-args", args.worker_args])
    finally:
        broker.stop(2)
    load1 = os.getloadavg()
    res.update(sharded=True, shard_ranks=SHARD_RANKS, shards=shards, workers=n,
               sustained=rate, sustained_rank_steps_per_s=wall, load_share=args.load,
               live_rank_steps_per_s=args.ranks / step_s, step_s=step_s,
               target_p99_s=bound, p99_within_target=bool(res.get("p99_s") is not None
                                                          and res["p99_s"] <= bound),
               loadavg_before=load0, loadavg_after=load1,
               when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    print(f"sharded, {n} workers, {args.ranks:,} ranks at {step_s} s steps: latency p50 "
          f"{res.get('p50_s') or 0:.2f} s, p95 {res.get('p95_s') or 0:.2f} s, p99 "
          f"{res.get('p99_s') or 0:.2f} s over {res.get('samples')} faults; target "
          f"2.5 x step + 1 = {bound:.2f} s: {'met' if res['p99_within_target'] else 'NOT met'}"
          f"; workers' cores busy {res.get('worker_cores_busy')}; load {load0} -> {load1}",
          flush=True)
    RESULTS.mkdir(exist_ok=True)
    dest = RESULTS / "streams_latency_sharded.json"
    runs = json.loads(dest.read_text())["runs"] if dest.exists() else []
    dest.write_text(json.dumps({"runs": [*runs, res]}, indent=2))
    print(f"wrote {dest} (run {len(runs) + 1})")


def run_workers(n: int, argv: list[str]) -> dict:
    """streams_latency.main with ``n`` workers; its result."""
    install_workers(n)
    with tempfile.TemporaryDirectory() as tmp:
        sl.RESULTS = Path(tmp)
        sys.argv = [sys.argv[0], *argv]
        sl.main()
        res = json.loads(next(Path(tmp).glob("*.json")).read_text())
    res["worker_cores_busy"] = WORKER_CPU.get("cores_busy")
    lat = res.get("latency_s") or []
    res["p95_s"] = float(np.percentile(lat, 95)) if lat else None
    return res


def install_workers(n: int) -> None:
    """streams_latency starts ``n`` workers in its group instead of one."""

    class Workers:
        """``n`` workers in the group; the first serves the metrics streams_latency reads."""

        def __init__(self, bootstrap, topics, group, metrics_port, extra, log_path):
            self.workers = [WorkerProcess(bootstrap, topics, group=group,
                                          metrics_port=metrics_port if i == 0 else free_port(),
                                          extra=extra, log_path=log_path) for i in range(n)]
            self.proc = self.workers[0].proc
            self.t0 = time.monotonic()
            self.cpu0 = [cpu_seconds(w.proc.pid) for w in self.workers]

        def stop(self) -> int:
            # how busy each worker was over the run (start-up and group join included)
            span = time.monotonic() - self.t0
            WORKER_CPU["cores_busy"] = [
                round((cpu_seconds(w.proc.pid) - c) / span, 3) if w.proc.poll() is None else None
                for w, c in zip(self.workers, self.cpu0, strict=True)]
            return max(w.stop() for w in self.workers)

    sl.WorkerProcess = Workers  # type: ignore[assignment,misc]


def main() -> None:
    if "--sharded" in sys.argv:
        main_sharded(sys.argv[1:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    args, rest = ap.parse_known_args()
    n = args.workers

    install_workers(n)
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
