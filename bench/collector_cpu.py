"""Collector cost per sample cycle: 8 GPUs (fake NVML) + 8 RDMA NICs (fake sysfs) + host.

Runs the real samplers and the real Publisher against a Tansu broker started here,
``--cycles`` times back to back, and reports the CPU time of one cycle (sampling,
encoding, producing, delivery callbacks), what that is as a share of one core at a
1 s interval, the share measured over ``--paced`` cycles really 1 s apart (adds
librdkafka's idle threads), and the process's peak RSS. Targets: < 1 % of a core, < 60 MB.

    .venv/bin/python bench/collector_cpu.py [--cycles 300]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fakes.nvml import FakeGpu, FakeNVML  # noqa: E402

from failslow.collectors.agent import Agent  # noqa: E402
from failslow.collectors.gpu import GpuSampler  # noqa: E402
from failslow.collectors.host import HostSampler  # noqa: E402
from failslow.collectors.nic import NicSampler  # noqa: E402
from failslow.collectors.publisher import Publisher  # noqa: E402
from failslow.schema import Topics  # noqa: E402
from failslow.stack import create_topics, start_broker  # noqa: E402


def fake_sys(root: Path, nics: int) -> None:
    """A sysfs tree with ``nics`` mlx5 ports, copied from the test fixture's mlx5_0."""
    src = ROOT / "tests/fixtures/sysfs/class/infiniband/mlx5_0"
    for i in range(nics):
        shutil.copytree(src, root / f"class/infiniband/mlx5_{i}")
    (root / "class/net").mkdir(parents=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--nics", type=int, default=8)
    ap.add_argument("--paced", type=int, default=10, help="cycles at the real 1 s interval")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp())
    fake_sys(tmp / "sys", args.nics)
    broker = start_broker()
    try:
        topics = Topics("bench.")
        create_topics(broker.bootstrap, topics)
        pub = Publisher(broker.bootstrap, topics, spool_dir=str(tmp / "spool"), linger_ms=100)
        nvml = FakeNVML([FakeGpu(uuid=f"GPU-{i}") for i in range(args.gpus)])
        samplers = [GpuSampler(nvml=nvml, host="bench"),
                    NicSampler(host="bench", sys_root=str(tmp / "sys"), include_net=False),
                    HostSampler(host="bench")]
        agent = Agent(samplers, pub, interval_s=1.0, report_s=1e9)
        for _ in range(20):  # warm up (imports, first scans, producer connection)
            agent.cycle()
        pub.flush(10)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(args.cycles):
            agent.cycle()
        left = pub.flush(30)
        cpu = (time.process_time() - cpu0) / args.cycles
        wall = (time.perf_counter() - wall0) / args.cycles
        events = sum(agent.counts.values()) // agent.cycles
        # Paced at the real 1 s interval: adds the idle cost of the producer's threads.
        cpu1, wall1 = time.process_time(), time.perf_counter()
        agent.interval_s = 1.0
        agent.run(threading.Event(), cycles=agent.cycles + args.paced)
        paced_pct = 100 * (time.process_time() - cpu1) / (time.perf_counter() - wall1)
        pub.close()
    finally:
        broker.stop(timeout=1)
        shutil.rmtree(tmp, ignore_errors=True)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"gpus": args.gpus, "nics": args.nics, "cycles": args.cycles,
              "events_per_cycle": events, "cpu_ms_per_cycle": round(cpu * 1000, 3),
              "wall_ms_per_cycle": round(wall * 1000, 3),
              "core_pct_at_1s_interval": round(cpu * 100, 3),
              "core_pct_paced_1s": round(paced_pct, 3), "peak_rss_mb": round(rss_mb, 1),
              "undelivered": left, "targets": {"core_pct": 1.0, "rss_mb": 60}}
    print(json.dumps(result, indent=2))
    out = ROOT / "bench/results/collector_cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
