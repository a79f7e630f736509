"""The training hook's ``comm`` grain in a real (one-rank, gloo) torch.distributed world:
windows close at every step end and every ``window_s`` inside a step (even when no op
ends for a while), their entries equal the raw ``collective`` events of the same ops
(``grain="both"`` publishes both), and the grain is chosen by argument or environment."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="torch is not installed (pip install failslow[torch])")

import torch.distributed as dist  # noqa: E402

from failslow.collectors.comm_windows import split_blocked  # noqa: E402
from failslow.collectors.torch_hook import TrainingHook, resolve_grain  # noqa: E402
from failslow.schema import validate  # noqa: E402
from failslow.stack import free_port  # noqa: E402


class _Sink:
    def __init__(self) -> None:
        self.events: list[dict] = []

    def publish(self, events: list[dict]) -> None:
        self.events += events

    def kind(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["kind"] == kind]


@pytest.fixture
def world1():
    dist.init_process_group("gloo", rank=0, world_size=1,
                            init_method=f"tcp://127.0.0.1:{free_port()}")
    yield
    dist.destroy_process_group()


def _hook(sink: _Sink, **kw) -> TrainingHook:
    return TrainingHook(sink, job_id="j", host="h0", **kw).install()


def test_windows_close_at_step_end_and_every_window_s(world1):
    sink = _Sink()
    hook = _hook(sink, grain="both", window_s=0.2)
    t = torch.ones(8)
    with hook.step(0):
        dist.all_reduce(t)
        time.sleep(1.0)  # no op ends for 1 s: the window holding the first closes anyway
        dist.all_reduce(t)
    with hook.step(1):
        dist.all_reduce(t)
    hook.close()
    comm = sink.kind("comm")
    raw = sorted(sink.kind("collective"), key=lambda e: e["seq"])
    for ev in comm:
        validate(ev)
    step0 = [e for e in comm if e["step"] == 0]
    # windows with no op that ended in them publish nothing: one sub-step window with the
    # first all-reduce, closed before the second began, and the step's last window
    assert [(e["step_end"], [o["n"] for o in e["ops"]]) for e in step0] == [
        (False, [1]), (True, [1])]
    assert step0[0]["ts"] < raw[1]["start_ts"]
    assert step0[0]["window_start_ts"] < raw[0]["start_ts"] <= raw[0]["ts"] <= step0[0]["ts"]
    assert step0[0]["ts"] <= step0[1]["window_start_ts"] + 1e-6
    assert [(e["step"], e["step_end"]) for e in comm if e["step"] != 0] == [(1, True)]
    step_ev = {e["step"]: e for e in sink.kind("step")}
    assert abs(step0[1]["ts"] - step_ev[0]["ts"]) < 0.05


def _mixed_step(hook: TrainingHook, i: int) -> None:
    with hook.step(i):
        t = torch.ones(64)
        for _ in range(3):
            dist.all_reduce(t)
        works = [dist.all_reduce(torch.ones(16 * (k + 1)), async_op=True) for k in range(3)]
        for w in works:
            w.wait()
        dist.broadcast(t, src=0)
        dist.all_gather([torch.zeros(8)], torch.ones(8))
        dist.barrier()


def test_entries_equal_the_raw_events_of_the_same_ops(world1):
    sink = _Sink()
    hook = _hook(sink, grain="both", window_s=0.05)
    for i in range(6):
        _mixed_step(hook, i)
    dist.all_reduce(torch.ones(4))  # outside any step
    hook.close()
    raw: dict[tuple, list[dict]] = defaultdict(list)
    for ev in sink.kind("collective"):
        raw[(ev["step"], ev["group"], ev["op"])].append(ev)
    summed: dict[tuple, dict] = {}
    blocked_per_step: dict[int | None, float] = defaultdict(float)
    for rec in sink.kind("comm"):
        validate(rec)
        assert rec["rank"] == 0 and rec["host"] == "h0" and rec["window_start_ts"] <= rec["ts"]
        for e in rec["ops"]:
            key = (rec["step"], e["group"], e["op"])
            blocked_per_step[rec["step"]] += e["blocked_s"]
            s = summed.setdefault(key, {"n": 0, "bytes": 0, "blocked_s": 0.0, "min_s": INF,
                                        "max_s": 0.0, "seqs": set()})
            s["n"] += e["n"]
            s["bytes"] += e["bytes"]
            s["blocked_s"] += e["blocked_s"]
            s["min_s"] = min(s["min_s"], e["min_s"])
            s["max_s"] = max(s["max_s"], e["max_s"])
            s["seqs"] |= set(range(e["first_seq"], e["last_seq"] + 1))
    assert set(summed) == set(raw)
    for key, evs in raw.items():
        s = summed[key]
        assert s["n"] == len(evs) and s["bytes"] == sum(e["bytes"] for e in evs), key
        assert s["min_s"] == min(e["duration_s"] for e in evs), key
        assert s["max_s"] == max(e["duration_s"] for e in evs), key
        assert {e["seq"] for e in evs} <= s["seqs"], key
        assert 0.0 <= s["blocked_s"] <= sum(e["duration_s"] for e in evs) + 1e-9, key
    # a step's entries never count more blocked time than the step's comm_s holds
    for ev in sink.kind("step"):
        assert blocked_per_step[ev["step"]] <= ev["comm_s"] + 1e-6, ev["step"]
    assert None in blocked_per_step  # the op outside steps, in a step-less window


def test_grain_from_argument_or_environment(world1, monkeypatch):
    for grain, kinds in (("comm", {"comm", "step"}), ("collective", {"collective", "step"})):
        sink = _Sink()
        hook = _hook(sink, grain=grain)
        _mixed_step(hook, 0)
        hook.close()
        assert {e["kind"] for e in sink.events} == kinds
    sink = _Sink()
    hook = _hook(sink)
    _mixed_step(hook, 0)
    hook.close()
    assert hook.grain == "comm" and hook.window_s == 1.0
    assert {e["kind"] for e in sink.events} == {"comm", "step"}
    monkeypatch.setenv("FAILSLOW_HOOK_GRAIN", "collective")
    monkeypatch.setenv("FAILSLOW_HOOK_WINDOW_S", "0.5")
    assert resolve_grain() == ("collective", 0.5)
    assert resolve_grain("comm", 2) == ("comm", 2.0)
    for bad in ({"grain": "ops"}, {"window_s": 0}, {"window_s": float("nan")}):
        with pytest.raises(ValueError):
            resolve_grain(**bad)
    monkeypatch.setenv("FAILSLOW_HOOK_WINDOW_S", "soon")
    with pytest.raises(ValueError, match="FAILSLOW_HOOK_WINDOW_S"):
        resolve_grain()


INF = float("inf")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 20)), min_size=1, max_size=12),
       st.lists(st.integers(0, 80), max_size=6),
       st.lists(st.tuples(st.integers(0, 80), st.integers(1, 15)), max_size=5))
def test_windows_share_as_if_every_op_were_known_at_once(ops, closes, waits):
    """Ops issued, ended and cut into windows in time order (a window closes at each
    ``closes`` tick and at the step's end): with the rank's waits known, each op gets the
    part it would get with all ops known at once, so nothing is counted twice across
    windows, and the pruning between closes loses nothing."""
    hook = TrainingHook(_Sink(), job_id="j", rank=0, world_size=1, grain="comm")
    hook._begin_step(0, None)
    s = hook._step
    for a, d in waits:
        s.blocked.wait(float(a), float(a + d))
    timeline = []
    for i, (a, d) in enumerate(ops):
        timeline += [(a, 1, i), (a + d, 0, i)]  # at a tick: ends, then issues, then closes
    timeline += [(t, 2, -1) for t in closes]
    handles, entries = {}, {}
    for t, what, i in sorted(timeline):
        if what == 1:
            h = handles[i] = hook._on_issue("allreduce", None, 8, None, None, float(t))
            h.ev["group"], h.waited = f"g{i}", True
            s.open_ops += 1
            s.in_flight[id(h)] = h
        elif what == 0:
            hook._end_op(handles[i], float(t))
        else:
            for rec in hook._comm_window(s, float(t), final=False):
                entries.update({e["group"]: e for e in rec["ops"]})
    for rec in hook._comm_window(s, 100.0, final=True):
        entries.update({e["group"]: e for e in rec["ops"]})
    spans = [(float(a), float(a + d)) for a, d in ops]
    want = split_blocked(spans, [], s.blocked.waits)
    got = [entries[f"g{i}"]["blocked_s"] for i in range(len(ops))]
    assert all(abs(g - w) < 1e-9 for g, w in zip(got, want, strict=True)), (got, want)
