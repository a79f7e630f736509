"""A host's ``comm_batch`` taken as columns (models/comm.py ``CommRows``, the detector's
``comm_batch`` branch): the same incidents, byte for byte, as its rows given one by one as
``comm`` events, with the step, sub-step and pipeline-pair evidence of the windows."""

from __future__ import annotations

import orjson
import pytest

from failslow.models.comm import CommRows, CommWindows, _Columns
from failslow.models.config import JobConfig
from failslow.models.p2p import P2PMonitor
from failslow.models.pipeline import Detector
from failslow.schema.batches import batch_trace, expand, to_batch
from failslow.simulator import SCENARIOS, simulate


def _incidents(events: list[dict]) -> bytes:
    det = Detector()
    out = []
    for i in range(0, len(events), 400):
        out += det.process_batch(events[i:i + 400])
    out += det.flush()
    assert det.rejected == 0 and det.errors == 0, det.last_error
    return b"\n".join(orjson.dumps(x, option=orjson.OPT_SORT_KEYS) for x in out)


def _no_steps(events: list[dict]) -> list[dict]:
    """A job whose producer knows no steps (an NCCL Inspector tailer)."""
    out = []
    for e in events:
        if e["kind"] == "step":
            continue
        if e["kind"] == "comm":
            e = dict(e, step=None)
            e.pop("step_end", None)
        out.append(e)
    return out


@pytest.mark.parametrize("name,steps,no_steps", [
    ("pipeline_stage_slow", 45, False),     # pipeline pairs, a slow stage
    ("slow_link_host_50", 60, False),       # a host's NICs: the pairs' evidence
    ("long8_stage_clock_30", 17, False),    # 8 s steps: sub-step judgements mid-step
    ("first8_errors_30", 8, False),         # slow from the first op, long steps
    ("gpu_thermal_30", 50, True),           # no step events: derived steps
])
def test_batched_windows_give_the_incidents_of_the_windows_one_by_one(name, steps, no_steps):
    events = list(simulate(SCENARIOS[name], seed=1, steps=steps).events())
    if no_steps:
        events = _no_steps(events)
    batched = list(batch_trace(events))
    assert sum(e["kind"] == "comm_batch" for e in batched) > 0
    one_by_one = [row for e in batched
                  for row in (expand(e) if e["kind"] == "comm_batch" else [e])]
    want = _incidents(one_by_one)
    assert b'"severity":"warning"' in want or b'"severity":"critical"' in want, \
        "nothing found: nothing compared"
    assert _incidents(batched) == want
    if name == "slow_link_host_50":
        assert _incidents(events) == want      # and the trace as the ranks sent it


def _window(r: int, peer: int, step: int, w0: float, cost: float, end: bool) -> dict:
    op = "send" if r < peer else "recv"
    return {"v": 1, "kind": "comm", "job_id": "j", "rank": r, "host": f"h{r // 8}",
            "step": step, "window_start_ts": w0, "ts": w0 + (0.4 if end else 1.0),
            "step_end": end, "world_size": 16,
            "ops": [{"group": f"pp{min(r, peer)}-{max(r, peer)}", "group_size": 2, "op": op,
                     "peer": peer, "n": 4, "bytes": 4 << 27, "min_s": cost,
                     "blocked_s": 4 * cost, "max_s": cost}]}


def test_a_pair_confirmed_inside_a_batch_is_confirmed_at_its_row():
    """Per-window pipeline-pair evidence (models.p2p) over one host's batch per window:
    the rows that confirm, and the findings, are those of the windows one by one."""
    pairs = [(i, 8 + i) for i in range(8)]       # rank i on h0 <-> rank 8 + i on h1
    by_rows, by_events = P2PMonitor(JobConfig()), P2PMonitor(JobConfig())
    got, want = [], []
    t = 0.0
    for s in range(8):
        for k in range(8):
            slow = s >= 5 and k >= 2
            for host in (0, 1):
                rows = [_window(r, p, s, t + k, 0.05 if slow and 2 in (r, p) else 0.01, k == 7)
                        for a, b in pairs for r, p in ((a, b), (b, a)) if r // 8 == host]
                c = CommRows.of_batch(to_batch(rows))
                steps = [s] * c.n
                i = 0
                while i < c.n:
                    done = by_rows.add_rows(c, steps, i, c.n, stop=True)
                    if not done:
                        break
                    got.append((s, k, rows[done[0]]["rank"], list(by_rows.last)))
                    i = done[0] + 1
                for ev in rows:
                    if by_events.add_comm(ev, s):
                        want.append((s, k, ev["rank"], list(by_events.last)))
        for mon in (by_rows, by_events):
            mon.last = mon.evaluate(s, {}, t + 7.4, 7.4, 16)
        t += 7.4
    assert want and got == want


def test_batch_columns_are_the_rows_columns():
    rows = [_window(r, 8 + r, 3, 100.0, 0.01 * (r + 1), False) for r in range(4)]
    rows[1]["ops"][0].pop("peer")          # absent in one entry only
    del rows[2]["world_size"]
    rows[3]["ops"].append(dict(rows[3]["ops"][0], group="tp0", op="allreduce",
                               group_size=8, blocked_s=1))
    a, b = CommRows.of_batch(to_batch(rows)), CommRows.of_events(rows)
    for name in CommRows.__slots__:
        if name != "_sums":
            assert list(getattr(a, name)) == list(getattr(b, name)) \
                if isinstance(getattr(a, name), list) else getattr(a, name) == getattr(b, name)
    assert [a.event(i) for i in range(a.n)] == [{k: v for k, v in r.items()} for r in rows]
    ball, p2p, isp = a.sums()
    assert isp == [True, True, True, True, False]
    assert p2p == [0.04, 0.08, 0.12, 0.16]
    assert ball == [0.04, 0.08, 0.12, 0.16 + 1]


def test_a_large_batch_sums_its_rows_in_entry_order():
    """Rows summed with numpy (a batch of many entries) give the floats a loop gives."""
    rows = [_window(r % 8, 8 + r % 8, 0, 10.0 + r, 0.1 + r * 1e-3 / 3, False)
            for r in range(600)]
    for i, row in enumerate(rows):
        row["ops"] += [dict(row["ops"][0], op="allreduce", blocked_s=0.3 / (j + 1))
                       for j in range(i % 3)]
    c = CommRows.of_events(rows)
    assert len(c.blocked) >= 1024
    ball, p2p, _ = c.sums()
    for i, row in enumerate(rows):
        acc = acc_p = 0.0
        for e in row["ops"]:
            acc += e["blocked_s"]
            if e["op"] in ("send", "recv"):
                acc_p += e["blocked_s"]
        assert (ball[i], p2p[i]) == (acc, acc_p)


@pytest.mark.parametrize("seed", range(3))
def test_row_sums_of_any_layout_are_the_loops(seed):
    """``sums`` of a batch's rows, whatever its layout (rows of equal entries or not, send/recv
    at the same positions or not), are the floats of a loop over each row's entries, -0.0
    kept."""
    import random

    rng = random.Random(seed)
    grid = 0
    for _ in range(400):
        n = rng.randrange(1, 9)
        k = rng.randrange(0, 4)
        lens = [k] * n if rng.random() < 0.7 else [rng.randrange(0, 4) for _ in range(n)]
        kinds = [rng.choice(("allreduce", "send", "recv")) for _ in range(4)]
        rows = []
        for r in range(n):
            row = _window(r, 8 + r, 0, 10.0, 0.1, False)
            row["ops"] = [dict(row["ops"][0], blocked_s=rng.choice((0.0, -0.0, 1e-17, 0.3, 7.0)),
                               op=kinds[j] if rng.random() < 0.95 else "allreduce")
                          for j in range(lens[r])]
            rows.append(row)
        ball, p2p, _ = CommRows.of_batch(to_batch(rows)).sums()
        want = []
        for row in rows:
            acc = acc_p = 0.0
            for e in row["ops"]:
                acc += e["blocked_s"]
                if e["op"] in ("send", "recv"):
                    acc_p += e["blocked_s"]
            want.append((acc, acc_p))
        assert repr(list(zip(ball, p2p, strict=True))) == repr(want)
        grid += len(set(lens)) == 1
    assert grid > 100


def test_a_batch_of_windows_without_entries_is_taken_as_its_rows():
    """Windows with no entries (valid: the batch then writes no entry columns) are taken,
    not rejected: the same columns as the rows one by one, and no detector rejection."""
    rows = [_window(r, 8 + r, 0, 10.0, 0.01, False) for r in range(3)]
    for row in rows:
        row["ops"] = []
    b = to_batch(rows)
    assert b["ops"] == {}
    a, e = CommRows.of_batch(b), CommRows.of_events(rows)
    for name in CommRows.__slots__:
        if name != "_sums":
            assert list(getattr(a, name)) == list(getattr(e, name)) \
                if isinstance(getattr(a, name), (list, tuple)) \
                else getattr(a, name) == getattr(e, name), name
    assert a.sums()[:2] == ([0.0] * 3, [0.0] * 3)
    det = Detector()
    det.process_batch([b])
    assert det.rejected == 0 and det.errors == 0, det.last_error


def test_a_batch_with_a_broken_layout_is_rejected_not_raised():
    rows = [_window(r, 8 + r, 0, 10.0, 0.01, False) for r in range(3)]
    bad = to_batch(rows)
    bad["ops"]["n"] = [4]                  # one value for three entries
    det = Detector()
    assert det.process_batch([bad]) == []
    assert det.rejected == 1 and det.errors == 0


def test_step_windows_pickled_as_tuples_restore_with_the_same_sums():
    """A snapshot from before the plain-list columns (``(group, op)`` and ``(blocked_s,
    bytes, n, min_s)`` tuples per entry) gives the same collectives and times."""
    rows = [_window(r, 8 + r, 0, 10.0, 0.01 * (r + 1), False) for r in range(8)]
    rows += [_window(8 + r, r, 0, 10.0, 0.02, False) for r in range(8)]
    now = CommWindows()
    for ev in rows:
        now.add(ev, 0)
    old = _Columns.__new__(_Columns)
    old.__setstate__((None, {
        "keys": [(e["group"], e["op"]) for ev in rows for e in ev["ops"]],
        "nums": [(e["blocked_s"], e["bytes"], e["n"], e["min_s"])
                 for ev in rows for e in ev["ops"]],
        "ranks": [ev["rank"] for ev in rows], "counts": [1] * len(rows)}))
    back = CommWindows()
    back.steps[0] = old
    times = [(now.take_time(r, 0), back.take_time(r, 0)) for r in range(16)]
    assert all(a == b and a is not None for a, b in times)
    want = now.take_step(0)
    assert want and back.take_step(0) == want


def test_a_pair_confirmed_mid_batch_pages_as_with_the_windows_one_by_one():
    """The detector, batched input: a pipeline pair confirmed from windows inside a long
    step (models.p2p) is judged at the row that confirms it, with a tensor-parallel group
    on each host ticking in the same batches (models.substep)."""
    t0 = 1.7e9
    events: list[dict] = []
    t = t0
    for s in range(10):
        for k in range(8):
            end = k == 7
            for host in (0, 1):
                for r in range(8 * host, 8 * host + 8):
                    peer = r + 8 if r < 8 else r - 8
                    slow = s >= 5 and k >= 2 and r % 8 == 2
                    ev = _window(r, peer, s, t + k, 0.05 if slow else 0.01, end)
                    ev["ts"] += 0.001 * r
                    ev["ops"].append({"group": f"tp{host}", "group_size": 8, "op": "allreduce",
                                      "n": 6, "blocked_s": 0.06 - 0.003 * (r % 8 == 5),
                                      "min_s": 0.005, "max_s": 0.02, "bytes": 6 << 20})
                    events.append(ev)
        t += 7.4
        events += [{"v": 1, "kind": "step", "ts": t + 0.001 * r, "job_id": "j", "rank": r,
                    "host": f"h{r // 8}", "world_size": 16, "step": s, "duration_s": 7.4}
                   for r in range(16)]
    batched = list(batch_trace(events))
    assert sum(e["kind"] == "comm_batch" for e in batched) >= 2 * 8 * 10
    want = _incidents(events)
    assert b"p2p timing (windows)" in want
    assert _incidents(batched) == want
