"""How well can ANY per-rank statistic separate a 1.5x (or 2x) DDP culprit from healthy
ranks on the kept real traces? (issue 13: the 1.5x target)

The detector runs on each kept trace (``bench/real_ddp.py --keep``) as `failslow detect`
does; ``RankEvidence.judge`` is wrapped (here only, nothing changes) to record, per judged
step and rank, the series the windowed tests read: ``x`` the peer series (log of own work
over its peers' reference), the learned noise of that series and the windowed z of the
verdict. Candidate statistics, each a value per step and rank:

- ``verdict_z``: the detector's windowed z (the own-past test, or the far test);
- ``cp_peer_sd``: a change point in the rank's OWN peer series: over every split with 8-24
  steps after it (up to now) and the up to 32 before it, (mean after - mean before -
  delta/2) over the standard error of that difference, the noise the before-segment's
  sample deviation, AR(1) 0.3 inflation; a steady offset from the first step has no
  change point;
- ``cp_peer_learned``: the same with the detector's learned noise of the series;
- ``cp_rank``: the same change point on the rank's place among its peers each step (0 the
  fastest, 1 the slowest): immune to spikes and to the size of the noise;
- ``mean24``: the plain 24-step mean of the peer series (the size of the excess);
- ``far_z_long``, ``own_far_z_long``: the z of the far verdict over 24 and 32 steps, and of
  a large change (far_rel) against its own past there (where its mean reaches 0.9 far_rel):
  the windows where the detector's bar is LONG_Z (3), not z_min.

Per statistic: the culprits' largest value after the onset (DDP 1.5x and 2x, pipeline
stage 2x), every healthy rank's largest value after the warm-up (all kept jobs: DDP,
FSDP2, TP, pipeline, benign and fault runs), and the culprits reached at the bar that the
second-largest healthy value sets (one false page in all the healthy series).

    .venv/bin/python bench/real_ddp_separation.py DIR [DIR ...] [--out F]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from failslow.cli import main as cli  # noqa: E402
from failslow.models import evidence as E  # noqa: E402
from failslow.models import job as J  # noqa: E402

DELTA = float(np.log1p(0.05))      # min_rel, as the own-past test's delta
WARM = 16                          # healthy ranks: steps from which their values count
LONG = (24, 32)                    # the windows of the far bar LONG_Z (models/evidence.py)
SCENARIOS = ("ddp:compute1.5x", "ddp:compute2x", "pipeline:compute2x")

_rec: list[dict[str, Any]] = []


def _wrap() -> None:
    judge0 = E.RankEvidence.judge
    scores0 = J.JobState._scores

    def scores(self: Any, row: Any, ranks: Any, work: Any, groups: Any) -> Any:
        out = scores0(self, row, ranks, work, groups)
        _rec.append({"ranks": list(ranks), "work": np.array(work), "groups": np.array(groups)})
        return out

    def judge(self: Any, ranks: Any, rel: Any, z: Any, rel2: Any, z2: Any, sig2: Any,
              peers: Any, warm: Any, early: Any, recent: Any, job_s: Any, floor: Any,
              clean: Any) -> Any:
        v = judge0(self, ranks, rel, z, rel2, z2, sig2, peers, warm, early, recent, job_s,
                   floor, clean)
        rows = self.peer.rows_for(ranks)
        sig_p = np.where(warm, sig2, floor)
        far = float(np.log1p(self.cfg.far_rel))
        # the long windows' z at far_rel (the bar LONG_Z applies there): against peers, and
        # against its own past where the mean reaches 0.9 far_rel
        _, _, zp, _ = self.peer.test(rows, sig_p, far, 4.0, scales=LONG, robust=True)
        _, mo, zo, _ = self.own.test(rows, sig2, far, 4.0, scales=LONG, robust=True)
        _rec[-1].update(x=self.peer.vals[rows, -1].copy(), z=np.array(v.z),
                        noise=self.peer.noise(rows, sig_p).copy(),
                        zp=np.where(peers, zp, -np.inf),
                        zo=np.where(warm & (mo >= 0.9 * far), zo, -np.inf))
        return v

    E.RankEvidence.judge = judge
    J.JobState._scores = scores


def series(d: Path) -> dict[str, np.ndarray]:
    """Per step x rank: x, z, noise, work, and the last step's groups."""
    _rec.clear()
    files = sorted(str(f) for f in d.glob("rank*.jsonl"))
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(io.StringIO()):
        cli(["detect", *files, "--out", f"{tmp}/incidents.jsonl"])
    steps = [s for s in _rec if "x" in s]
    n = max(max(s["ranks"]) for s in steps) + 1
    out = {k: np.full((len(steps), n), np.nan) for k in ("x", "z", "noise", "work", "zp", "zo")}
    for t, s in enumerate(steps):
        for k in out:
            out[k][t, s["ranks"]] = s[k]
    g = np.zeros(n, dtype=np.int64)
    g[steps[-1]["ranks"]] = steps[-1]["groups"]
    out["groups"] = g
    return out


def place(m: dict[str, np.ndarray]) -> np.ndarray:
    """Each rank's place among the ranks of its group each step (0 fastest, 1 slowest)."""
    w, g = m["work"], m["groups"]
    out = np.full(w.shape, np.nan)
    for label in np.unique(g):
        idx = np.flatnonzero(g == label)
        if idx.size < 3:
            continue
        v = w[:, idx]
        ok = ~np.isnan(v).any(axis=1)
        out[np.ix_(ok, idx)] = np.argsort(np.argsort(v[ok], axis=1), axis=1) / (idx.size - 1)
    return out


def _infl(n: int, rho: float = 0.3) -> float:
    lag = np.arange(1, n)
    return float(1.0 + 2.0 * ((1.0 - lag / n) * rho ** lag).sum())


def change_point(x: np.ndarray, noise: np.ndarray | None, delta: float,
                 floor: float = 0.0) -> np.ndarray:
    """Per step and rank: the largest z over splits of (mean after - mean before - delta/2)."""
    T, R = x.shape
    out = np.full((T, R), -np.inf)
    for t in range(T):
        for i in range(R):
            for na in range(8, 25):
                k = t - na + 1
                if k < 4:
                    break
                a, b = x[k:t + 1, i], x[max(0, k - 32):k, i]
                a, b = a[np.isfinite(a)], b[np.isfinite(b)]
                if a.size < 6 or b.size < 8:
                    continue
                d = a.mean() - b.mean()
                if d < 0.9 * delta:
                    continue
                s = max(float(noise[t, i]) if noise is not None else b.std(ddof=1), floor)
                se = s * np.sqrt(_infl(a.size) / a.size + _infl(b.size) / b.size)
                out[t, i] = max(out[t, i], (d - delta / 2) / max(se, 1e-9))
    return out


def mean24(x: np.ndarray) -> np.ndarray:
    out = np.full(x.shape, -np.inf)
    for t in range(23, x.shape[0]):
        w = x[t - 23:t + 1]
        ok = np.isfinite(w).sum(axis=0) >= 18
        out[t] = np.where(ok, np.nanmean(np.where(np.isfinite(w), w, np.nan), axis=0), -np.inf)
    return out


STATS = {
    "verdict_z": lambda m: np.where(np.isfinite(m["z"]), m["z"], -np.inf),
    "cp_peer_sd": lambda m: change_point(m["x"], None, DELTA),
    "cp_peer_learned": lambda m: change_point(m["x"], m["noise"], DELTA),
    "cp_rank": lambda m: change_point(place(m), None, 0.1, floor=0.25),
    "mean24": lambda m: mean24(m["x"]),
    "far_z_long": lambda m: np.where(np.isfinite(m["zp"]), m["zp"], -np.inf),
    "own_far_z_long": lambda m: np.where(np.isfinite(m["zo"]), m["zo"], -np.inf),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--out", default=str(ROOT / "bench/results/real_ddp_separation.json"))
    args = ap.parse_args()
    _wrap()
    culprits: dict[str, dict[str, list[float]]] = {s: {} for s in STATS}
    healthy: dict[str, list[float]] = {s: [] for s in STATS}
    traces = 0
    for d in sorted(p for root in args.dirs for p in Path(root).glob("repeat*/*-*")):
        if not (d / "truth.json").exists():
            continue
        truth = json.loads((d / "truth.json").read_text())
        m = series(d)
        traces += 1
        key = f"{truth['kind']}:{truth['scenario']}"
        for name, f in STATS.items():
            v = f(m)
            for r in range(v.shape[1]):
                if r == truth["culprit"]:
                    if key in SCENARIOS:
                        culprits[name].setdefault(key, []).append(
                            round(float(np.max(v[truth["onset_step"]:, r])), 2))
                else:
                    healthy[name].append(round(float(np.max(v[WARM:, r])), 2))
    rows = []
    print(f"{traces} traces; healthy rank series: {len(healthy['verdict_z'])}")
    print(f"{'statistic':16} {'bar':>6} {'DDP 1.5x':>8} {'DDP 2x':>6} {'pipe 2x':>7}  "
          "healthy top 3")
    for name in STATS:
        h = sorted(healthy[name], reverse=True)
        bar = h[1]          # one healthy series over it in all kept jobs
        row: dict[str, Any] = {"statistic": name, "bar": bar, "healthy_top": h[:5]}
        cols = []
        for key in SCENARIOS:
            c = sorted(culprits[name].get(key, []))
            row[key] = c
            row[f"named {key}"] = sum(v > bar for v in c)
            cols.append(f"{row[f'named {key}']}/{len(c)}")
        rows.append(row)
        print(f"{name:16} {bar:>6.2f} {cols[0]:>8} {cols[1]:>6} {cols[2]:>7}  {h[:3]}")
    Path(args.out).write_text(json.dumps({"dirs": args.dirs, "traces": traces,
                                          "healthy_series": len(healthy["verdict_z"]),
                                          "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
