"""The ``comm`` grain: one step's collectives summed into per-rank windows (CONTRACT.md).

A rank's step ``[t0, end]`` is cut into windows that close every ``window_s`` after the
step's start and at its end, as the producers close them (``collectors.comm_windows``);
every op is counted in the window its end falls in. Per (rank, window, group, op, peer)
one ``ops`` entry: ``n``, ``blocked_s`` (the simulated rank is blocked for the whole of
each op, so the sum of durations), ``min_s``/``max_s``, ``bytes``, ``first_seq``/
``last_seq``, ``first_start_ts``. As the producers do, a window in which no op ended
sends no record, so a rank-step costs at most ``ceil(step_s / window_s)`` records
whatever the number of collectives.

The aggregation is numpy (one sort, segment reductions); only the entries are built as
dicts, about five per rank and window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from failslow.simulator.jsonl import Choices, Const, Num, Pick, Table

if TYPE_CHECKING:
    from failslow.simulator.physics import StepOut

GRAINS = ("comm", "collective")
DEFAULT_WINDOW_S = 1.0
_STEP_END = Choices([False, True])


def comm_table(out: StepOut, skew: np.ndarray, window_s: float, *, job: Const,
               host: Choices, world: int, gpu: np.ndarray, group: list[str],
               group_size: list[int], op_names: list) -> Table:
    """The ``comm`` records of one job step (``skew``: each rank's host clock offset, s)."""
    n_ranks = len(out.t0)
    t0 = out.t0 + skew
    end = np.round(out.end + skew, 6)
    # Windows per rank: ceil(duration / window_s), at least one (the step-end window).
    nwin = np.maximum(np.ceil((end - t0) / window_s - 1e-9).astype(np.int64), 1)
    first = np.concatenate([[0], np.cumsum(nwin)[:-1]])    # row of each rank's window 0
    rows = int(nwin.sum())
    rank_of = np.repeat(np.arange(n_ranks), nwin)
    w = np.arange(rows) - first[rank_of]
    w_start = np.round(t0[rank_of] + w * window_s, 6)
    w_end = np.where(w == nwin[rank_of] - 1, end[rank_of],
                     np.round(t0[rank_of] + (w + 1) * window_s, 6))
    w_start = np.minimum(w_start, w_end)

    col = out.coll
    ranks = col["rank"]
    cskew = skew[ranks]
    cend = np.round(col["end"] + cskew, 6)
    cstart = np.round(col["start"] + cskew, 6)
    dur = np.round(cend - cstart, 7)
    k = np.ceil((cend - t0[ranks]) / window_s - 1e-9).astype(np.int64) - 1
    row = first[ranks] + np.clip(k, 0, nwin[ranks] - 1)
    peer = col["peer"]
    # One entry per (row, group, op, peer), ops in seq order inside it.
    order = np.lexsort((col["seq"], peer, col["op"], col["gid"], row))
    keys = np.stack([row, col["gid"], col["op"], peer])[:, order]
    cut = np.flatnonzero(np.any(keys[:, 1:] != keys[:, :-1], axis=0)) + 1
    seg = np.concatenate([[0], cut])
    d = dur[order]
    ent_row = row[order][seg]
    ent_gid = col["gid"][order][seg]
    ent_op = col["op"][order][seg]
    ent_peer = peer[order][seg]
    n = np.diff(np.concatenate([seg, [len(order)]])) if len(order) else np.zeros(0, np.int64)
    seq = col["seq"][order]
    cols = zip(ent_row.tolist(), ent_gid.tolist(), ent_op.tolist(), ent_peer.tolist(),
               n.tolist(), np.round(np.add.reduceat(d, seg), 7).tolist() if len(d) else [],
               np.minimum.reduceat(d, seg).tolist() if len(d) else [],
               np.maximum.reduceat(d, seg).tolist() if len(d) else [],
               np.add.reduceat(col["bytes"][order], seg).tolist() if len(d) else [],
               seq[seg].tolist(), seq[np.concatenate([cut - 1, [len(order) - 1]])].tolist()
               if len(d) else [], cstart[order][seg].tolist(), strict=True)
    ops: list[list[dict]] = [[] for _ in range(rows)]
    for r, g, o, p, cnt, blocked, lo, hi, nbytes, s0, s1, st in cols:
        entry = {"group": group[g], "group_size": group_size[g], "op": op_names[o], "n": cnt,
                 "blocked_s": blocked, "min_s": lo, "max_s": hi, "bytes": nbytes}
        if p >= 0:
            entry["peer"] = p
        entry["first_seq"] = s0
        entry["last_seq"] = s1
        entry["first_start_ts"] = st
        ops[r].append(entry)
    # As the producers: no record for a window in which no op ended.
    keep = np.flatnonzero([bool(o) for o in ops])
    ops = [ops[i] for i in keep.tolist()]
    rank_of, w, w_start, w_end = rank_of[keep], w[keep], w_start[keep], w_end[keep]
    is_end = (w == nwin[rank_of] - 1).astype(np.int64)
    return Table([
        ("v", Const(1)), ("kind", Const("comm")), ("ts", Num(w_end, 6)), ("job_id", job),
        ("rank", Num(rank_of)), ("host", Pick(rank_of, host)),
        ("window_start_ts", Num(w_start, 6)), ("ops", Pick(np.arange(len(ops)), Choices(ops))),
        ("step", Const(out.step)), ("step_end", Pick(is_end, _STEP_END)),
        ("world_size", Const(world)), ("gpu", Num(gpu[rank_of]))], w_end)
