"""Hostile input for the input caps (streams.limits), shared by tests/test_streams_limits.py
and bench/streams_flood.py: what a buggy collector could send."""

from __future__ import annotations


def hostile_events(ts: float, u: int, world_size: int = 1 << 20) -> list[dict]:
    """Four events numbered ``u`` at ``ts``: a step of a new job (``flood-u``), a step of the
    job ``hostile`` inventing rank ``u`` on host ``fhu``, a collective of ``hostile`` in a
    new group ``gu``, and a GPU sample of a new host ``flood-host-u``."""
    step = {"v": 1, "kind": "step", "ts": ts, "rank": 0, "world_size": 1, "host": "fh0",
            "step": u, "duration_s": 1.0}
    return [
        {**step, "job_id": f"flood-{u}"},
        {**step, "job_id": "hostile", "rank": u, "world_size": world_size, "host": f"fh{u}"},
        {"v": 1, "kind": "collective", "ts": ts, "job_id": "hostile", "rank": 0,
         "host": "fh0", "group": f"g{u}", "group_size": 2, "op": "allreduce",
         "seq": u, "start_ts": ts - 0.01, "duration_s": 0.01, "bytes": 8},
        {"v": 1, "kind": "gpu", "ts": ts, "host": f"flood-host-{u}", "gpu": 0,
         "uuid": f"GPU-{u}"},
    ]
