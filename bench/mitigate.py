"""Does applying the mitigation recover the slowdown (issue 32)? A real 4-rank DDP job on
CPU (gloo), training hook on (comm grain), ``mitigate = auto``, beside an oracle.

The fault multiplies one rank's per-sample compute (extra layers on its activations, as a
throttled GPU does) from ``--onset`` to ``--recover``. Three runs per factor, one after
another on this machine:

* ``none``: nobody acts: the slowed step time;
* ``auto``: the loop closed in this process: the ranks' event files are tailed in ts
  order into the worker's detector (``models.acting.ActingDetector`` around
  ``models.pipeline.Detector``, as the worker and ``failslow detect`` build it), whose
  actions are appended to the file every rank's ``FileActionSource`` tails (as the host
  agent does);
* ``oracle``: shares in proportion to the ranks' true speeds (1 / factor for the
  culprit), switched at the step ``auto`` switched and back at ``--recover``.

All three run the same detector and planner in this process (its CPU is on the same two
cores as the ranks': before, only ``auto`` paid it); only ``auto``'s actions reach the
ranks.

Each run's slowdown is its median step over [applied, recover) against its own base,
minus one (the VM's load drifts between runs; each run is compared with itself): the mean
of its medians before the onset and after the recovery and auto's rollback (the load also
drifts during a run; ``slow_pre_only`` keeps the former, before-only measure); ``--repeats`` sequences, medians over them. Printed per factor: steps from the
page (or, for an incident that never pages, from its opening) to the applied switch, the
refinements, steps from the recovery and from the incident's resolve to the rollback,
false actions (before the onset), the slowdowns, ``recovered``: (none - run) / none for auto and oracle, and
``recovered_vs_oracle``, their ratio. Results: bench/results/mitigate.json.

    .venv/bin/python bench/mitigate.py [--factors 2,1.5] [--steps 200] [--onset 50]
        [--recover 150] [--repeats 2]
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from failslow.collectors.actions import FileActionSource  # noqa: E402
from failslow.collectors.file_publisher import FilePublisher  # noqa: E402
from failslow.collectors.torch_hook import TrainingHook  # noqa: E402
from failslow.models.acting import ActingDetector  # noqa: E402
from failslow.models.actions import ActionPlanner, MitigationConfig  # noqa: E402
from failslow.models.pipeline import Detector  # noqa: E402
from failslow.stack import free_port  # noqa: E402

WORLD, WIDTH, LAYERS, BATCH = 4, 512, 4, 2048   # global batch of 2048 samples
CULPRIT = 2


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))
        self.extra: list[torch.Tensor] = []   # the fault's extra per-sample work

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        if self.extra:
            y = x
            for w in self.extra:
                y = torch.relu(y @ w)
            x = x + 0.0 * y   # keeps the extra chain in backward too
        return x


class OracleSource:
    """The oracle's actions, the same on every rank: shares in proportion to the true
    speeds from ``at``, equal again from ``recover`` (each handed over a few steps before
    its step: a newer version held supersedes an older one not yet applied)."""

    def __init__(self, factor: float, at: int, recover: int) -> None:
        speed = [1.0 / factor if r == CULPRIT else 1.0 for r in range(WORLD)]
        self.script = {0: self._action(1, at, [round(v / sum(speed), 4) for v in speed]),
                       max(at + 1, recover - 3): self._action(2, recover, [0.25] * WORLD)}
        self.calls = 0

    @staticmethod
    def _action(version: int, at: int, shares: list[float]) -> dict:
        return {"v": 1, "kind": "action", "ts": time.time(), "action_id": f"oracle:{version}",
                "job_id": "mitigate", "incident_id": "oracle", "type": "rebalance_microbatches",
                "mode": "apply", "apply_at_step": at, "expires_ts": time.time() + 3600,
                "version": version, "shares": shares, "reason": "oracle"}

    def poll(self) -> list[dict]:
        got = self.script.get(self.calls)
        self.calls += 1
        return [got] if got else []


def _rank(rank: int, port: int, out: str, steps: int, onset: int, recover: int,
          factor: float, oracle_at: int | None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    pub = FilePublisher(Path(out) / f"rank{rank}.jsonl")
    hook = TrainingHook(pub, job_id="mitigate", host=f"host{rank}", dp_rank=rank,
                        grain="comm").install()
    source = (OracleSource(factor, oracle_at, recover) if oracle_at is not None
              else FileActionSource(Path(out) / "actions.jsonl"))
    mit = hook.enable_actions(source)
    net = Net()
    model = torch.nn.parallel.DistributedDataParallel(net)
    hook.instrument_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g))
            for _ in range(4)]
    extra = [torch.randn(WIDTH, WIDTH) * 0.01 for _ in range(round((factor - 1) * LAYERS))]
    for i in range(steps):
        if rank == CULPRIT:
            net.extra = extra if onset <= i < recover else []
        part = hook.batch_share(BATCH)
        x, y = data[i % 4]
        with hook.step(i):
            loss = torch.nn.functional.mse_loss(model(x[part]), y[part]) * hook.loss_scale()
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.barrier()
    hook.close()
    pub.close()
    (Path(out) / f"switches{rank}.json").write_text(json.dumps(mit.switches))
    dist.destroy_process_group()


class Loop(threading.Thread):
    """The worker's part, in-process: rank files -> detector -> planner -> actions file.
    Every run has one, so every run pays its CPU on this machine's cores; only ``auto``'s
    writes where the ranks read (``sink``), the others' actions go nowhere."""

    def __init__(self, out: Path, sink: str = "actions.jsonl") -> None:
        super().__init__(daemon=True)
        self.out, self.sink, self.stop = out, sink, threading.Event()
        self.cpu_s = 0.0
        self.det = ActingDetector(Detector(), ActionPlanner(MitigationConfig(mode="auto")))
        self.incidents: list[dict] = []
        self.actions: list[dict] = []
        self.step_ts: dict[int, float] = {}

    def run(self) -> None:
        srcs = [FileActionSource(self.out / f"rank{r}.jsonl") for r in range(WORLD)]
        heap: list[tuple[float, int, dict]] = []
        newest = [0.0] * WORLD
        n = 0
        cpu0 = time.thread_time()
        with open(self.out / self.sink, "ab") as sink:
            while not self.stop.is_set():
                for r, src in enumerate(srcs):
                    for ev in src.poll():
                        newest[r] = max(newest[r], ev["ts"])
                        heapq.heappush(heap, (ev["ts"], n, ev))
                        n += 1
                # every rank's file is in ts order: below the oldest newest, order is final
                mark = min(newest)
                while heap and heap[0][0] <= mark:
                    self._feed(heapq.heappop(heap)[2], sink)
                self.cpu_s = time.thread_time() - cpu0
                time.sleep(0.02)

    def _feed(self, ev: dict, sink) -> None:
        if ev["kind"] == "step" and ev["rank"] == 0:
            self.step_ts[ev["step"]] = ev["ts"]
        out = self.det.process_batch([ev])
        for inc in out:
            if inc["kind"] == "incident":
                inc["_step"] = max(self.step_ts, default=0)
                self.incidents.append(inc)
        for a in (e for e in out if e["kind"] == "action"):
            a["_step"] = max(self.step_ts, default=0)
            self.actions.append(a)
            sink.write(json.dumps({k: v for k, v in a.items() if k != "_step"}).encode() + b"\n")
            sink.flush()


def run(out: Path, mode: str, steps: int, onset: int, recover: int, factor: float,
        oracle_at: int | None = None) -> dict:
    out.mkdir(parents=True)
    loop = Loop(out, "actions.jsonl" if mode == "auto" else "actions.unread.jsonl")
    loop.start()
    t0 = time.monotonic()
    mp.spawn(_rank, args=(free_port(), str(out), steps, onset, recover, factor, oracle_at),
             nprocs=WORLD)
    time.sleep(0.5)
    loop.stop.set()
    loop.join()
    evs = [json.loads(line) for line in (out / "rank0.jsonl").read_text().splitlines()]
    step_s = {e["step"]: e["duration_s"] for e in evs if e["kind"] == "step"}
    switches = json.loads((out / "switches0.json").read_text())
    res = {"mode": mode, "wall_s": round(time.monotonic() - t0, 1), "step_s": step_s,
           "switches": [(s["step"], s["shares"]) for s in switches],
           "loop_cpu_s": round(loop.cpu_s, 1)}
    if mode == "auto":
        res["incidents"] = [{k: i.get(k) for k in ("_step", "status", "severity", "rank",
                                                   "fault", "mitigation", "incident_id")}
                            for i in loop.incidents]
        res["actions"] = [{k: a.get(k) for k in ("_step", "mode", "apply_at_step", "shares",
                                                 "reason", "incident_id", "rank", "rollback")}
                          for a in loop.actions]
    return res


def window(step_s: dict, lo: int, hi: int) -> float | None:
    vals = [v for s, v in step_s.items() if lo <= s < hi]
    return median(vals) if vals else None


def _rel(step_s: dict, on: int, lo: int, hi: int, post: int | None = None) -> float:
    """The run's median step over [lo, hi) against its own base, minus one: each run is
    compared with itself, so the shared VM's load drifting between runs moves the
    comparison less. The base is the median before the onset, averaged with the median
    from ``post`` on (once the fault and every action are over) when given: a load that
    drifts during the run moves both ends, and their mean is what the middle is judged
    against."""
    base = window(step_s, 10, on)
    after = window(step_s, post, max(step_s) + 1) if post is not None else None
    if after is not None:
        base = (base + after) / 2
    return window(step_s, lo, hi) / base - 1.0


def one_repeat(factor: float, args: argparse.Namespace, tmp: Path) -> dict:
    on, rec, steps = args.onset, args.recover, args.steps
    none = run(tmp / "none", "none", steps, on, rec, factor)
    auto = run(tmp / "auto", "auto", steps, on, rec, factor)
    # the incident acted on: its page (or its opening, for one acted on once it persisted
    # at info), its resolve, its refinements
    acted = next((a for a in auto["actions"] if a["rank"] == CULPRIT and a["_step"] >= on
                  and not a["rollback"] and a["mode"] == "apply"), None)
    evs = [i for i in auto["incidents"] if acted and i["incident_id"] == acted["incident_id"]]
    pages = [i["_step"] for i in evs if i["severity"] in ("warning", "critical")]
    page = pages[0] if pages else (evs[0]["_step"] if evs else None)
    resolve = next((i["_step"] for i in evs if i["status"] == "resolved"), None)
    refined = sum(1 for a in auto["actions"] if acted and a["incident_id"] == acted["incident_id"]
                  and (a["reason"] or "").startswith("refined"))
    # the culprit's rebalance (the first switch after the onset that gives it less), and
    # the first switch back to equal shares after it; anything before the onset is a
    # false action, counted apart
    sw = auto["switches"]
    mine = [i for i, (st, sh) in enumerate(sw) if st >= on and sh[CULPRIT] < 1 / WORLD]
    applied = sw[mine[0]][0] if mine else None
    back = [st for st, sh in sw[mine[0]:] if max(sh) - min(sh) < 1e-3] if mine else []
    rollback = next((st for st in back if st > applied), None) if mine else None
    false_actions = [(st, sh) for st, sh in sw if st < on and max(sh) - min(sh) > 1e-3]
    at = applied if applied is not None else on + 10
    # the same after-window for the three runs: past the recovery and auto's rollback
    post = max(rec, rollback or rec) + 5
    oracle = run(tmp / "oracle", "oracle", steps, on, rec, factor, oracle_at=at)
    resolves = [i["_step"] for i in auto["incidents"]
                if i["rank"] == CULPRIT and i["status"] == "resolved"]
    return {
        "page_step": page, "paged": bool(pages), "applied_step": applied,
        "applied_after_page": None if page is None or applied is None else applied - page,
        "refinements": refined, "rollback_step": rollback, "resolve_step": resolve,
        "rollback_after_recover": None if rollback is None else rollback - rec,
        "resolve_after_recover": None if resolve is None else resolve - rec,
        "rollback_after_resolve": None if rollback is None or resolve is None
        else rollback - resolve,
        "culprit_resolves": resolves,
        "shares": sw[mine[0]][1] if mine else None,
        "switches": sw, "false_actions_before_onset": false_actions,
        "base_s": [round(window(r["step_s"], 10, on), 4) for r in (none, auto, oracle)],
        "post_step": post,
        "post_s": [None if post >= steps else round(window(r["step_s"], post, steps), 4)
                   for r in (none, auto, oracle)],
        "slow_none": round(_rel(none["step_s"], on, at, rec, post), 4),
        "slow_auto": round(_rel(auto["step_s"], on, at, rec, post), 4),
        "slow_oracle": round(_rel(oracle["step_s"], on, at, rec, post), 4),
        "slow_pre_only": [round(_rel(r["step_s"], on, at, rec), 4) for r in (none, auto, oracle)],
        "after_rollback_auto": None if rollback is None or rollback + 2 >= steps
        else round(_rel(auto["step_s"], on, rollback + 2, steps), 4),
        "wall_s": [none["wall_s"], auto["wall_s"], oracle["wall_s"]],
        "loop_cpu_s": [none["loop_cpu_s"], auto["loop_cpu_s"], oracle["loop_cpu_s"]],
        "actions": auto["actions"], "incidents": auto["incidents"],
    }


def factor_row(factor: float, args: argparse.Namespace, tmp: Path) -> dict:
    reps = [one_repeat(factor, args, tmp / f"f{factor}r{r}") for r in range(args.repeats)]
    med = {k: median(r[k] for r in reps) for k in ("slow_none", "slow_auto", "slow_oracle")}
    rec_auto = rec_oracle = None
    if med["slow_none"] > 0:
        rec_auto = (med["slow_none"] - med["slow_auto"]) / med["slow_none"]
        rec_oracle = (med["slow_none"] - med["slow_oracle"]) / med["slow_none"]
    return {
        "factor": factor, "repeats": len(reps),
        "applied_after_page": [r["applied_after_page"] for r in reps],
        "refinements": [r["refinements"] for r in reps],
        "rollback_after_recover": [r["rollback_after_recover"] for r in reps],
        "resolve_after_recover": [r["resolve_after_recover"] for r in reps],
        "rollback_after_resolve": [r["rollback_after_resolve"] for r in reps],
        "shares_culprit": [[round(sh[CULPRIT], 3) for st, sh in r["switches"]] for r in reps],
        "after_rollback_auto": [r["after_rollback_auto"] for r in reps],
        "false_actions": sum(len(r["false_actions_before_onset"]) for r in reps),
        **{f"{k}_med": round(v, 4) for k, v in med.items()},
        "recovered_auto": None if rec_auto is None else round(rec_auto, 3),
        "recovered_oracle": None if rec_oracle is None else round(rec_oracle, 3),
        "recovered_vs_oracle": None if not rec_auto or not rec_oracle
        else round(rec_auto / rec_oracle, 3),
        "runs": reps,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factors", default="2,1.5")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--onset", type=int, default=50)
    ap.add_argument("--recover", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench/results/mitigate.json"))
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    rows = []
    load0 = [round(x, 1) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        for f in (float(x) for x in args.factors.split(",")):
            row = factor_row(f, args, Path(tmp))
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "world": WORLD, "global_batch": BATCH, "steps": args.steps, "onset": args.onset,
        "recover": args.recover, "note": args.note, "load_start": load0,
        "load_end": [round(x, 1) for x in os.getloadavg()], "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
