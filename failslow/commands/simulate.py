"""`failslow simulate` — write a simulated trace (JSON Lines) and its ground truth.

    failslow simulate --list
    failslow simulate gpu_thermal_30 --out trace.jsonl [--seed 0] [--steps 200]
    failslow simulate healthy_16 --schedule faults.txt --out trace.jsonl
    failslow simulate gpu_thermal_30 --kafka [--out trace.jsonl]
    failslow simulate gpu_thermal_30 --grain collective --out trace.jsonl
    failslow simulate gpu_thermal_30 --per-rank --out trace.jsonl

The trace goes to FILE, the ground truth to FILE.truth.json; with ``--kafka`` the
events are also published through the collectors' publisher (same code path as
the real collectors), to the topics under the configured prefix.

The trace is what the producers publish: a host agent relays its ranks' ``comm``
windows as one ``comm_batch`` per host and window and their steps as one ``step_batch``,
samples its GPUs as one ``gpu_batch`` and its NIC ports as one ``nic_batch``
(docs/contract.md, "Batch kinds"); collectives and host samples stay per event.
``--per-rank`` writes every record as its own per-rank event instead
(what a job without an agent publishes); ``failslow detect`` gives the same incidents on
both.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from failslow.simulator.comm import DEFAULT_WINDOW_S, GRAINS

HELP = "write a simulated trace and its ground truth"
DEFAULT_SCENARIO = "healthy_16"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", nargs="?", help=f"scenario name (default {DEFAULT_SCENARIO};"
                        " see --list)")
    parser.add_argument("--out", help="trace file (JSON Lines); truth goes to FILE.truth.json")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--steps", type=int, help="number of steps (default: the scenario's)")
    parser.add_argument("--schedule", help="injection schedule file added to the scenario "
                        "(format: docs/schedules.md)")
    parser.add_argument("--grain", choices=GRAINS, default="comm",
                        help="collective timing as comm windows (default) or one collective "
                        "event per op")
    parser.add_argument("--window-s", type=float, default=DEFAULT_WINDOW_S,
                        help="comm grain: a window closes every WINDOW_S seconds inside a step "
                        f"and at its end (default {DEFAULT_WINDOW_S:g})")
    parser.add_argument("--per-rank", action="store_true",
                        help="write every comm window, step, GPU and NIC sample as its own "
                        "per-rank event, as a job without a host agent publishes them (default: "
                        "one comm_batch / step_batch / gpu_batch / nic_batch per host and "
                        "window, as the agents "
                        "publish; "
                        "docs/contract.md 'Batch kinds'; detect gives the same incidents)")
    parser.add_argument("--batch", action="store_true", help=argparse.SUPPRESS)  # the default
    parser.add_argument("--list", action="store_true", help="print the scenarios and exit")
    parser.add_argument("--kafka", action="store_true",
                        help="also publish the events to Kafka (--bootstrap, --topic-prefix)")
    parser.add_argument("--realtime", action="store_true",
                        help="pace events to the wall clock (with --kafka)")


def run(args: argparse.Namespace) -> int:
    from failslow.config import resolve
    from failslow.simulator import SCENARIOS, SimulatorError, load_schedule, simulate

    if args.list:
        for sc in SCENARIOS.values():
            print(f"{sc.name}  {sc.description}")
        return 0
    name = args.scenario or DEFAULT_SCENARIO
    if name not in SCENARIOS:
        raise SimulatorError(f"unknown scenario {name!r} (failslow simulate --list names them)")
    if not args.out and not args.kafka:
        raise SimulatorError("nothing to do: give --out FILE and/or --kafka")
    extra = load_schedule(args.schedule) if args.schedule else ()
    trace = simulate(SCENARIOS[name], seed=args.seed, steps=args.steps, extra_faults=extra,
                     grain=args.grain, window_s=args.window_s)
    if args.kafka:
        n = _publish(trace, resolve(args), args.realtime, batched=not args.per_rank)
        print(f"published {n} events to {resolve(args).bootstrap}", file=sys.stderr)
    if args.out:
        try:
            n = trace.write_jsonl(args.out) if args.per_rank else _write_batched(trace, args.out)
        except OSError as exc:
            raise SimulatorError(f"cannot write {args.out}: {exc.strerror or exc}") from None
        print(f"wrote {n} events to {args.out} and the truth to {args.out}.truth.json",
              file=sys.stderr)
    return 0


def _write_batched(trace, out: str) -> int:
    """The trace batched as ``schema.batches.batch_trace`` batches it (``simulator.batching``:
    the same lines, at a cost linear in the events), and its truth; returns the lines
    written."""
    import orjson

    from failslow.simulator.batching import batch_events

    n = 0
    with open(out, "wb") as f:
        for ev in batch_events(trace.events()):
            f.write(orjson.dumps(ev) + b"\n")
            n += 1
    with open(out + ".truth.json", "wb") as f:
        f.write(orjson.dumps(trace.truth, option=orjson.OPT_INDENT_2))
    return n


def _stop_on_sigterm(_signum, _frame) -> None:
    raise KeyboardInterrupt  # unwinds through _publish's finally: the publisher flushes


def _publish(trace, settings, realtime: bool, batched: bool = True) -> int:
    from failslow.collectors.publisher import Publisher
    from failslow.schema import Topics
    from failslow.simulator import SimulatorError
    from failslow.simulator.batching import batch_events

    pub = Publisher(bootstrap=settings.bootstrap, topics=Topics(settings.topic_prefix))
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm) if main_thread else None
    n = 0
    try:
        if realtime or batched:
            events = trace.events(realtime=realtime)
            batch: list[dict] = []
            for event in batch_events(events) if batched else events:
                batch.append(event)
                if len(batch) >= 200 or event["kind"] in ("step", "step_batch"):
                    pub.publish(batch)
                    n += len(batch)
                    batch = []
            if batch:
                pub.publish(batch)
                n += len(batch)
        else:
            for chunk in trace.batches():
                pub.publish(chunk)
                n += len(chunk)
        left = pub.flush(timeout=30.0)
    finally:
        pub.close()
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    if left:
        raise SimulatorError(f"{left} events were not delivered to {settings.bootstrap}")
    return n
