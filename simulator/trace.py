"""Run a scenario: interleave its jobs' steps with cluster telemetry; ground truth.

``simulate(scenario, seed)`` returns a ``Trace``; nothing runs until it is read.
``trace.events()`` regenerates the same events every time (all randomness comes
from generators seeded by ``seed``); ``trace.truth`` is computed by a physics-only
pass if the events were not read yet.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson

from failslow.simulator.comm import DEFAULT_WINDOW_S, GRAINS
from failslow.simulator.effects import host_index, physics_effects
from failslow.simulator.emit import JobEvents
from failslow.simulator.job import JobRun
from failslow.simulator.jsonl import Table, ordered_dicts, ordered_lines
from failslow.simulator.physics import JobSim, StepOut
from failslow.simulator.spec import FaultSpec, Scenario, SimulatorError
from failslow.simulator.telemetry import Target, Telemetry
from failslow.simulator.topology import Layout
from failslow.simulator.truth import make_truth

DEFAULT_START_TS = 1_767_225_600.0  # 2026-01-01T00:00:00Z: fixed so traces are reproducible


class Trace:
    """One simulated run. Iterate ``events()``; read ``truth``; ``write_jsonl(path)``."""

    def __init__(self, scenario: Scenario, seed: int = 0, steps: int | None = None,
                 start_ts: float = DEFAULT_START_TS, grain: str = "comm",
                 window_s: float = DEFAULT_WINDOW_S):
        scenario.check()
        if grain not in GRAINS:
            raise SimulatorError(f"grain must be one of {', '.join(GRAINS)}, not {grain!r}")
        if not 0 < window_s < float("inf"):
            raise SimulatorError(f"window_s must be a positive number of seconds, not {window_s}")
        self.grain, self.window_s = grain, float(window_s)
        if steps is not None:
            if steps < 1:
                raise SimulatorError(f"steps must be >= 1, got {steps}")
            scenario = replace(scenario, steps=steps)
        self.scenario, self.seed, self.start_ts = scenario, seed, float(start_ts)
        self._truth: dict | None = None
        self._setup()  # rejects targets outside the cluster now, not halfway through a run

    # -- public ---------------------------------------------------------------

    @property
    def truth(self) -> dict:
        """Ground truth (see the brief's format); JSON-serializable."""
        if self._truth is None:
            for _ in self._chunks(emit=False):
                pass
        assert self._truth is not None
        return self._truth

    def events(self, realtime: bool = False, speed: float = 1.0) -> Iterator[dict]:
        """Every event, roughly in ts order. ``realtime`` paces them to the wall clock
        (``speed`` x faster than real time); the default is as fast as possible."""
        if not realtime:
            for chunk in self.batches():
                yield from chunk
            return
        wall0 = time.monotonic()
        for chunk in self.batches():
            for event in chunk:
                delay = (event["ts"] - self.start_ts) / speed - (time.monotonic() - wall0)
                if delay > 0.001:
                    time.sleep(delay)
                yield event

    def batches(self) -> Iterator[list[dict]]:
        """The events in chunks (one job step plus the telemetry of its window)."""
        for tables, order in self._chunks(emit=True):
            yield ordered_dicts(tables, order)

    def write_jsonl(self, path: str | os.PathLike) -> int:
        """Write the trace as JSON Lines to ``path`` and the truth to ``path``.truth.json;
        returns the number of events written."""
        path = Path(path)
        n = 0
        with open(path, "wb") as f:
            for tables, order in self._chunks(emit=True):
                f.writelines(ordered_lines(tables, order))
                n += len(order)
        truth_path = path.with_name(path.name + ".truth.json")
        truth_path.write_bytes(orjson.dumps(self.truth, option=orjson.OPT_INDENT_2))
        return n

    # -- the loop -------------------------------------------------------------

    def _setup(self) -> tuple[list[JobRun], int]:
        sc = self.scenario
        G = sc.gpus_per_host
        jobs: list[JobRun] = []
        offset = 0
        for k, spec in enumerate(sc.jobs):
            lay = Layout(spec.hosts * G, spec.tp, spec.pp, G, offset)
            rng = np.random.default_rng([self.seed, k])
            sim = JobSim(spec, lay, rng, self.start_ts)
            faults = [f for f in sc.faults if f.job == spec.job_id]
            for f in faults:
                for r in (f.rank, f.peer_rank):
                    if r is not None and not 0 <= r < lay.world:
                        raise SimulatorError(f"{f.kind}: rank {r} is outside {spec.job_id} "
                                             f"(world size {lay.world})")
                if f.host is not None and not 0 <= host_index(f.host) < self._n_hosts():
                    raise SimulatorError(f"{f.kind}: no host {f.host!r} in this cluster")
            gpus = lay.host_index * G + lay.gpu
            jobs.append(JobRun(spec, lay, sim, faults, gpus, spec.steps or sc.steps))
            offset += spec.hosts
        return jobs, offset + sc.idle_hosts

    def _n_hosts(self) -> int:
        return sum(j.hosts for j in self.scenario.jobs) + self.scenario.idle_hosts

    def _targets(self, jobs: list[JobRun]) -> list[Target]:
        G = self.scenario.gpus_per_host
        by_id = {j.spec.job_id: j for j in jobs}
        out = []
        for f in self.scenario.faults:
            job = by_id[f.job]
            ranks = [r for r in (f.rank, f.peer_rank) if r is not None]
            gpus = job.gpus[ranks] if ranks else np.zeros(0, dtype=np.int64)
            hosts = np.unique(job.lay.host_index[ranks]) if ranks else np.zeros(0, np.int64)
            nics = gpus
            if f.host is not None:
                h = host_index(f.host)
                hosts = np.array([h])
                nics = h * G + (np.arange(G) if f.nic is None else np.array([f.nic]))
                gpus = np.zeros(0, dtype=np.int64) if f.kind in ("slow_link", "nic_errors") \
                    else h * G + np.arange(G)
            out.append(Target(f.kind, f.start_s, f.end_s, f.intensity, gpus, nics, hosts,
                              f.ramp_s, f.period_s, f.duty))
        return out

    def _advance(self, job: JobRun, tel: Telemetry | None, benign: list[dict]) -> StepOut | None:
        sc, sim = self.scenario, job.sim
        t_rel = float(sim.ready.min()) - self.start_ts
        ended = any(f.kind == "job_end" and f.start_s <= t_rel for f in job.faults)
        if job.done >= job.limit or ended:
            return None
        spike = None
        clean = sim.warm >= sc.warmup_steps
        for i, f in enumerate(job.faults):
            if f.kind == "gc_spike" and i not in job.fired and f.start_s <= t_rel:
                job.fired.add(i)
                spike = np.zeros(job.lay.world)
                spike[slice(None) if f.rank is None else f.rank] = f.intensity * job.spec.step_s
                benign.append({"kind": "gc_spike", "job_id": job.spec.job_id, "rank": f.rank,
                               "start_ts": self.start_ts + t_rel, "end_ts": None})
            if f.active(t_rel):
                clean = clean and f.kind in ("checkpoint", "restart")
                job.onset.setdefault(i, sim.step)
        eff = physics_effects(job.faults, job.lay, sc.gpus_per_host, t_rel, job.spec.step_s)
        out = sim.next_step(eff, sc.warmup_steps, spike)
        if spike is not None:
            benign[-1]["end_ts"] = float(out.end.max())
            clean = False
        t_end = float(out.end.max()) - self.start_ts
        for i, f in enumerate(job.faults):
            if f.kind not in ("checkpoint", "restart") or i in job.fired or f.start_s > t_end:
                continue
            job.fired.add(i)
            clean = False
            secs = (f.end_s if f.end_s is not None else f.start_s + 30.0) - f.start_s
            sim.pause(out, f.kind, secs)
            kind, b, e = out.pauses[-1]
            entry: dict = {"kind": kind, "job_id": job.spec.job_id, "start_ts": b, "end_ts": e}
            if kind == "checkpoint":
                job.last_ckpt = out.step
            else:
                resume = (job.last_ckpt if job.last_ckpt is not None else out.step) + 1
                entry["rank"] = f.rank
                entry["resumed_at_step"] = resume
                sim.restart(resume)
            benign.append(entry)
            if tel is not None:
                tel.pause(job.gpus, b, e)
        job.series.append((t_rel, float(np.median(out.end - out.t0)), clean))
        job.done += 1
        return out

    def _chunks(self, emit: bool) -> Iterator[tuple[list[Table], np.ndarray]]:
        """Per job step: the tables of its events and of the telemetry sampled up to its
        end, and the order of their rows (numbered across the tables, in list order)."""
        sc = self.scenario
        jobs, n_hosts = self._setup()
        hosts = [f"h{h}" for h in range(n_hosts)]
        tel = None
        if emit:
            tel = Telemetry(n_hosts, sc.gpus_per_host, self._targets(jobs),
                            np.random.default_rng([self.seed, 10_000]), self.start_ts,
                            sc.sample_interval_s)
        # Host clocks (NTP) disagree by about a millisecond; events carry their host's time.
        clock = np.random.default_rng([self.seed, 20_000]).normal(0.0, 0.001, n_hosts)
        margin = 2.0 * float(np.abs(clock).max(initial=0.0)) + 1e-6
        held = _Held()
        benign: list[dict] = []
        for job in jobs:
            if emit:
                job.emit = JobEvents(job.spec.job_id, job.lay, hosts, job.spec.tokens_per_step,
                                     self.grain, self.window_s)
            end = job.spec.step_s * (sc.warmup_steps + 4)
            benign.append({"kind": "warmup", "job_id": job.spec.job_id,
                           "start_ts": self.start_ts, "end_ts": self.start_ts + end})
        pending: dict[int, StepOut] = {}
        for k, j in enumerate(jobs):
            first = self._advance(j, tel, benign)
            if first is not None:
                pending[k] = first
        last_ts = self.start_ts
        while pending:
            k = min(pending, key=lambda k: pending[k].end.max())
            job, out = jobs[k], pending.pop(k)
            last_ts = max(last_ts, float(out.end.max()))
            if tel is not None:
                tel.update(job.gpus, job.lay.grid.ravel(), job.spec.job_id, out.t0, out.end,
                           out.compute, out.comm, out.net_bytes)
                assert job.emit is not None
                events = job.emit.tables(out, clock[job.lay.host_index])
                samples = tel.sample_until(float(out.end.max()))
                held.add([*events, *samples], _merge_by_ts(events, samples))
            nxt = self._advance(job, tel, benign)
            if nxt is not None:
                pending[k] = nxt
            else:
                job.ended_ts = float(out.end.max())
                if job.done < (job.spec.steps or sc.steps):
                    benign.append({"kind": "job_end", "job_id": job.spec.job_id,
                                   "start_ts": job.ended_ts, "end_ts": None})
                if tel is not None:
                    tel.release(job.gpus)
            if tel is not None:
                # No later event is older than the next step of any job (a comm window
                # closes after its step began): rows up to there are final, the rest
                # (windows of a long step inside one that ended later) wait for it.
                starts = [float(p.t0.min()) for p in pending.values()]
                ready = held.until(min(starts, default=float("inf")) - margin)
                if ready is not None:
                    yield ready
        if tel is not None:
            samples = tel.sample_until(last_ts)
            held.add(samples, np.arange(sum(t.n for t in samples)))
            ready = held.until(float("inf"))
            if ready is not None:
                yield ready
        self._truth = make_truth(self.scenario, self.seed, self.start_ts, jobs, hosts, benign,
                                 last_ts)


class _Held:
    """Rows not yielded yet, in output order: tables and the order of their rows (numbered
    across the tables, in list order), as ``_chunks`` yields them."""

    def __init__(self) -> None:
        self.tables: list[Table] = []
        self.order = np.zeros(0, dtype=np.int64)

    def add(self, tables: list[Table], order: np.ndarray) -> None:
        """Merge rows (``order`` sorted by ts) after the held ones with the same ts."""
        base = sum(t.n for t in self.tables)
        if not len(self.order):
            self.tables, self.order = list(tables), order + base
            return
        held_ts = self._ts()[self.order]
        new_ts = np.concatenate([t.ts for t in tables])[order] if tables else np.zeros(0)
        at = np.searchsorted(held_ts, new_ts, side="right") + np.arange(len(new_ts))
        merged = np.empty(len(held_ts) + len(new_ts), dtype=np.int64)
        is_new = np.zeros(len(merged), dtype=bool)
        is_new[at] = True
        merged[at] = order + base
        merged[~is_new] = self.order
        self.tables += tables
        self.order = merged

    def until(self, horizon: float) -> tuple[list[Table], np.ndarray] | None:
        """Take the held rows with ts <= ``horizon`` (None if none)."""
        if not len(self.order):
            return None
        n = int(np.searchsorted(self._ts()[self.order], horizon, side="right"))
        if not n:
            return None
        out = (self.tables, self.order[:n])
        rest = self.order[n:]
        # Keep only the tables rows are still held from, renumbered.
        sizes = np.array([t.n for t in self.tables])
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        which = np.searchsorted(offsets, rest, side="right") - 1
        keep = np.unique(which)
        shift = np.zeros(len(self.tables), dtype=np.int64)
        shift[keep] = offsets[keep] - np.concatenate([[0], np.cumsum(sizes[keep])[:-1]])
        self.order = rest - shift[which]
        self.tables = [self.tables[i] for i in keep.tolist()]
        return out

    def _ts(self) -> np.ndarray:
        return np.concatenate([t.ts for t in self.tables])


def _merge_by_ts(events: tuple[Table, Table], samples: list[Table]) -> np.ndarray:
    """Order of the rows of ``events`` then ``samples``: the events (collective timing
    before steps at equal ts) sorted by ts, each telemetry sample (sorted by ts) inserted
    after the events with ts <= its own."""
    ev_ts = np.concatenate([t.ts for t in events])
    ev_order = np.argsort(ev_ts, kind="stable")
    if not samples:
        return ev_order
    s_ts = np.concatenate([t.ts for t in samples])
    s_order = np.argsort(s_ts, kind="stable")
    at = np.searchsorted(ev_ts[ev_order], s_ts[s_order], side="right")
    order = np.empty(len(ev_ts) + len(s_ts), dtype=np.int64)
    slots = at + np.arange(len(s_ts))
    order[slots] = s_order + len(ev_ts)
    is_event = np.ones(len(order), dtype=bool)
    is_event[slots] = False
    order[is_event] = ev_order
    return order


def simulate(scenario: Scenario, seed: int = 0, steps: int | None = None,
             start_ts: float = DEFAULT_START_TS, extra_faults: tuple[FaultSpec, ...] = (),
             grain: str = "comm", window_s: float = DEFAULT_WINDOW_S) -> Trace:
    """A lazily evaluated, deterministic trace of ``scenario`` under ``seed``.

    ``steps`` overrides the scenario's step count; ``extra_faults`` adds injections
    (e.g. from ``load_schedule``). ``grain``: collective timing as ``comm`` windows
    (default; closed every ``window_s`` inside a step and at its end) or one
    ``collective`` event per op; the physics and the truth are the same."""
    if extra_faults:
        scenario = replace(scenario, faults=(*scenario.faults, *extra_faults))
    return Trace(scenario, seed=seed, steps=steps, start_ts=start_ts, grain=grain,
                 window_s=window_s)
