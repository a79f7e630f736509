"""Real 4-rank torch jobs (gloo on CPU) instrumented with the training hook, for the
integration tests (tests/test_real_jobs.py) and bench/real_ddp.py. See ``harness.run_job``."""

from realjobs.harness import KINDS, SCENARIOS, run_job, run_jobs

__all__ = ["KINDS", "SCENARIOS", "run_job", "run_jobs"]
