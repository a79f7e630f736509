"""Device telemetry on change plus a heartbeat, as the host agent publishes it
(``collectors.samplers.OnChange``, default on in ``collectors.agent.Agent``): how many
samples it keeps, and whether detection stays the same.

Each simulator scenario's device samples go through the agent's filter one host cycle at
a time (``collectors.samplers.filter_trace``), with the default
``OnChangeConfig``: a sample is kept when a field the root cause reads moved past its
dead band, a counter's rate left its Poisson noise, for ``settle`` samples after such a
move, every ``heartbeat_s``, and at least one sample per (kind, host) and cycle. Every
non-large scenario runs through the Detector twice (all samples, kept samples); the
non-info incidents that open (fault, rank, host, root cause) are compared.

    .venv/bin/python bench/telemetry_onchange.py [--scenario NAME ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from failslow.collectors.samplers import OnChangeConfig, filter_trace  # noqa: E402
from failslow.models.pipeline import Detector  # noqa: E402
from failslow.simulator import SCENARIOS, simulate  # noqa: E402

TELEMETRY = ("gpu", "nic", "host")


def _brief(incidents: list[dict]) -> list[tuple]:
    return sorted({(i["fault"], i.get("rank"), i.get("host"), i.get("root_cause"))
                   for i in incidents if i["status"] == "open" and i["severity"] != "info"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", nargs="*",
                    default=[n for n, s in SCENARIOS.items() if not s.large])
    args = ap.parse_args()
    config = OnChangeConfig()
    total, kept = Counter(), Counter()
    differ = []
    for name in args.scenario:
        events = list(simulate(SCENARIOS[name], seed=0).events())
        fewer = filter_trace(events, config)
        total.update(e["kind"] for e in events)
        kept.update(e["kind"] for e in fewer)
        a, b = _brief(Detector().process_batch(events)), _brief(Detector().process_batch(fewer))
        if a != b:
            differ.append({"scenario": name, "all": a, "on_change": b})
        share = sum(e["kind"] in TELEMETRY for e in fewer) / max(
            sum(e["kind"] in TELEMETRY for e in events), 1)
        print(f"{name:28s} telemetry kept {share:5.1%}  incidents "
              f"{'same' if a == b else 'DIFFER'}", flush=True)
    tel_all = sum(total[k] for k in TELEMETRY)
    tel_kept = sum(kept[k] for k in TELEMETRY)
    result = {"code": "failslow.collectors.samplers.OnChange (the agent's filter)",
              "heartbeat_s": config.heartbeat_s, "settle_samples": config.settle,
              "per_host_min": config.per_host_min, "scenarios": len(args.scenario),
              "kept_share": {k: round(kept[k] / total[k], 3) for k in TELEMETRY if total[k]},
              "telemetry_kept_share": round(tel_kept / max(tel_all, 1), 3),
              "same_incidents": len(args.scenario) - len(differ), "differ": differ}
    print(json.dumps(result, indent=2))
    out = ROOT / "bench" / "results" / "telemetry_onchange.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
