"""Where a traced run writes: its job id, its run id and its files (no torch needed).

A trace is ``<trace dir>/<job id>/<run id>/rank<N>.jsonl``. Every run of a job gets a
folder of its own, so a rerun with the same job id never lands in the files of the run
before it (``failslow detect`` over one folder judges one run); ``FilePublisher``
refuses an existing file as well.

The job id, when nobody names it: ``FAILSLOW_JOB_ID``, else the scheduler's id
(``SLURM_JOB_ID``), else torchrun's rendezvous id (``TORCHELASTIC_RUN_ID``, unless it is
the random UUID that ``torchrun --standalone`` makes up, or ``none``), else the name of
the training script (``train`` for ``train.py``).

The run id: ``FAILSLOW_RUN_ID`` (``failslow run`` sets it for all the ranks it
starts), else one the ranks agree on through torch.distributed's store; a UTC time
and a random suffix (``20261128T023000-3fa2c1``), plus ``-r<N>`` for torchrun's Nth
restart of the workers.

>>> default_job_id({"SLURM_JOB_ID": "4242", "TORCHELASTIC_RUN_ID": "none"}, ["train.py"])
'4242'
>>> default_job_id({"TORCHELASTIC_RUN_ID": "8a0e1b64-1c1e-4c1a-9d8e-6c0a4f0e9b1d"},
...                ["/src/train.py", "--lr", "1e-4"])
'train'
>>> trace_path("traces", "llama 70b/3", "20261128T023000-3fa2c1", 7).as_posix()
'traces/llama_70b_3/20261128T023000-3fa2c1/rank7.jsonl'
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ENV_TRACE_DIR = "FAILSLOW_TRACE_DIR"
ENV_JOB_ID = "FAILSLOW_JOB_ID"
ENV_RUN_ID = "FAILSLOW_RUN_ID"


def _is_uuid(text: str) -> bool:
    import uuid  # here: this module loads at every armed interpreter start

    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def default_job_id(env: Mapping[str, str] | None = None,
                   argv: Sequence[str] | None = None) -> str:
    """The job id when none is given (order in the module docstring)."""
    env = os.environ if env is None else env
    argv = sys.argv if argv is None else argv
    for var in (ENV_JOB_ID, "SLURM_JOB_ID"):
        if env.get(var):
            return env[var]
    elastic = env.get("TORCHELASTIC_RUN_ID", "")
    if elastic and elastic != "none" and not _is_uuid(elastic):
        return elastic
    script = next((a for a in argv if a.endswith(".py")), argv[0] if argv else "")
    return Path(script).stem or "job"


def new_run_id() -> str:
    """A fresh run id: sorts by start time, unique across reruns in the same second."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + os.urandom(3).hex()


def restart_suffix(env: Mapping[str, str] | None = None) -> str:
    """``-r<N>`` for torchrun's Nth restart of the workers (same run id, new files)."""
    env = os.environ if env is None else env
    n = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"-r{n}" if n not in ("", "0") else ""


def safe_name(text: str) -> str:
    """``text`` usable as one path component (the event keeps the id as it was)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text).lstrip(".") or "_"


def run_dir(trace_dir: str | Path, job_id: str, run_id: str) -> Path:
    return Path(trace_dir) / safe_name(job_id) / safe_name(run_id)


def trace_path(trace_dir: str | Path, job_id: str, run_id: str, rank: int) -> Path:
    return run_dir(trace_dir, job_id, run_id) / f"rank{rank}.jsonl"
