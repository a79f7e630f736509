"""What publishing device telemetry on change (plus a heartbeat) would save, and whether
detection stays the same: an experiment on the simulator's traces, offline.

A device's sample is kept when a field the root cause reads moved past a dead band, a
counter's rate left its Poisson noise around the rate at the last kept sample, for
``SETTLE`` samples after such a move (so the Detector's per-sample averages settle),
and every ``HEART`` seconds; the rest is dropped. Every non-large scenario runs through
the Detector twice (all samples, kept samples); the non-info incidents that open
(fault, rank, host, root cause) are compared. Not yet in the collectors: see
docs/streams.md, "What device telemetry costs".

    .venv/bin/python bench/telemetry_onchange.py
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.pipeline import Detector  # noqa: E402
from models.telemetry import GPU_COUNTERS, NIC_COUNTERS  # noqa: E402
from simulator import SCENARIOS, simulate  # noqa: E402

HEART, SETTLE = 10.0, 5
RATE_REL = 0.25
COUNTERS = GPU_COUNTERS + NIC_COUNTERS
# field -> ("any",) | ("abs", band) | ("rel", band)
BANDS = {"sm_clock_mhz": ("rel", 0.02), "temp_c": ("abs", 2.0), "power_limit_w": ("rel", 0.02),
         "clocks_event_reasons": ("any",), "pcie_gen": ("any",), "pcie_width": ("any",),
         "pcie_max_gen": ("any",), "pcie_max_width": ("any",), "state": ("any",),
         "speed_gbps": ("any",), "cpu_steal_pct": ("abs", 2.0), "cpu_util_pct": ("abs", 5.0),
         "load1": ("rel", 0.1), "procs_running": ("abs", 2)}
TELEMETRY = ("gpu", "nic", "host")


def _moved(old: dict, new: dict) -> bool:
    for f, band in BANDS.items():
        a, b = old.get(f), new.get(f)
        if a == b:
            continue
        if a is None or b is None or band[0] == "any":
            return True
        if abs(a - b) > (band[1] if band[0] == "abs" else band[1] * max(abs(a), 1e-9)):
            return True
    return bool(new.get("xid"))


def _rates(a: dict, b: dict) -> dict[str, float]:
    dt = b["ts"] - a["ts"]
    return {c: (b[c] - a[c]) / dt for c in COUNTERS
            if dt > 0 and a.get(c) is not None and b.get(c) is not None}


def _rate_moved(ref: dict[str, float], now: dict[str, float]) -> bool:
    for c, r in now.items():
        r0 = ref.get(c, 0.0)
        if r < 0 or abs(r - r0) > max(RATE_REL * abs(r0), 3 * max(abs(r0), 1.0) ** 0.5 + 3):
            return True
    return False


def on_change(events: list[dict]) -> list[dict]:
    ref: dict[tuple, dict] = {}
    sent_ts: dict[tuple, float] = {}
    settle: dict[tuple, int] = {}
    prev: dict[tuple, dict] = {}
    ref_rates: dict[tuple, dict] = {}
    out = []
    for e in events:
        if e["kind"] not in TELEMETRY:
            out.append(e)
            continue
        dev = (e["kind"], e["host"], e.get("gpu"), e.get("nic"), e.get("port"))
        now_rates = _rates(prev[dev], e) if dev in prev else {}
        prev[dev] = e
        send = dev not in ref or e["ts"] - sent_ts[dev] >= HEART
        if not send and (_moved(ref[dev], e) or _rate_moved(ref_rates.get(dev, {}), now_rates)):
            ref_rates[dev] = now_rates
            settle[dev] = SETTLE
            send = True
        elif not send and settle.get(dev, 0) > 0:
            settle[dev] -= 1
            send = True
        if send:
            if dev not in ref or _moved(ref[dev], e):
                ref[dev] = e
            sent_ts[dev] = e["ts"]
            out.append(e)
    return out


def _brief(incidents: list[dict]) -> list[tuple]:
    return sorted({(i["fault"], i.get("rank"), i.get("host"), i.get("root_cause"))
                   for i in incidents if i["status"] == "open" and i["severity"] != "info"})


def main() -> None:
    total, kept = Counter(), Counter()
    differ = []
    names = [n for n, s in SCENARIOS.items() if not s.large]
    for name in names:
        events = list(simulate(SCENARIOS[name], seed=0).events())
        fewer = on_change(events)
        total.update(e["kind"] for e in events)
        kept.update(e["kind"] for e in fewer)
        a, b = _brief(Detector().process_batch(events)), _brief(Detector().process_batch(fewer))
        if a != b:
            differ.append({"scenario": name, "all": a, "on_change": b})
    tel_all = sum(total[k] for k in TELEMETRY)
    tel_kept = sum(kept[k] for k in TELEMETRY)
    result = {"heartbeat_s": HEART, "settle_samples": SETTLE, "scenarios": len(names),
              "kept_share": {k: round(kept[k] / total[k], 3) for k in TELEMETRY},
              "telemetry_kept_share": round(tel_kept / tel_all, 3),
              "same_incidents": len(names) - len(differ), "differ": differ}
    print(json.dumps(result, indent=2))
    out = ROOT / "bench" / "results" / "telemetry_onchange.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
