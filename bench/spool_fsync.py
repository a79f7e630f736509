"""What each spool fsync policy costs: messages/s appended to the on-disk spool.

A collector writes to its spool only while the broker is unreachable, one message per
(topic, host) per sample interval: a host with 8 GPUs and 8 NICs at 1 Hz spools ~3
messages a second. The numbers say how far each policy is from that.

    .venv/bin/python bench/spool_fsync.py [--messages N] [--bytes B]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from failslow.collectors.spool import FSYNC_POLICIES, Spool  # noqa: E402


def rate(policy: str, messages: int, size: int) -> float:
    value = b"x" * size
    with tempfile.TemporaryDirectory(dir=Path.home()) as d:
        spool = Spool(d, fsync=policy)
        t0 = time.perf_counter()
        for _ in range(messages):
            spool.append("failslow.gpu", "h0", value, 8)
        spool.close()
        return messages / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--bytes", type=int, default=2000, help="message size (8 GPU samples)")
    args = ap.parse_args()
    out: dict = {}
    for policy in FSYNC_POLICIES:
        n = args.messages // 10 if policy == "always" else args.messages
        out[f"{policy}_messages_per_s"] = round(rate(policy, n, args.bytes))
    out.update(message_bytes=args.bytes, machine=f"{platform.machine()} vm")
    for k, v in out.items():
        print(f"{k:32} {v}")
    path = Path(__file__).parent / "results" / "spool_fsync.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main()
