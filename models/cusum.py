"""The capped CUSUM of z-scores that confirms a culprit: one rule for ranks, collective
groups and point-to-point pairs.

Per step a culprit's evidence grows by its z-score (its excess in noise units) minus
``z_min / 2``; the z-score counts in full only where the relative excess reaches the
verdict's bar (``min_rel`` against its own past, ``far_rel`` against its peers), else
at most ``z_min / 2`` (nothing); one step adds at most ``z_min``. The sum never drops
below 0 and never exceeds ``confirm_z + z_min``, so it drains within a few steps once
the fault ends; it confirms at ``confirm_z`` (``confirm_steps * z_min``): a one-step spike
never confirms, a large slowdown in two steps. ``models.evidence`` takes a rank's
increment as the maximum over its two verdicts of ``capped_increment``.

>>> from types import SimpleNamespace
>>> import numpy as np

if TYPE_CHECKING:
    from failslow.models.config import JobConfig
>>> cfg = SimpleNamespace(z_min=4.0, confirm_z=8.0)
>>> capped_increment(np.array([0.5, 0.02, 0.5]), np.array([30.0, 30.0, 1.0]), 0.05, cfg).tolist()
[4.0, 0.0, -1.0]
>>> cusum_update(6.0, 4.0, cfg), cusum_update(1.0, -2.0, cfg), cusum_update(11.0, 4.0, cfg)
(10.0, 0.0, 12.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from failslow.models.config import JobConfig


def capped_increment(rel: Any, z: Any, bar: float, cfg: JobConfig) -> np.ndarray:
    """One step's evidence increment (z units): ``z`` in full where ``rel >= bar``, else at
    most ``z_min / 2``; at most ``z_min + z_min / 2``; minus ``z_min / 2``."""
    k = cfg.z_min / 2
    rel, z = np.asarray(rel, dtype=float), np.asarray(z, dtype=float)
    return np.minimum(np.where(rel >= bar, z, np.minimum(z, k)), cfg.z_min + k) - k


def cusum_update(cusum: float, inc: float, cfg: JobConfig) -> float:
    """The capped CUSUM after one step's increment."""
    return min(max(0.0, cusum + inc), cfg.confirm_z + cfg.z_min)
