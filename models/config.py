"""The thresholds every model of a job reads (``JobConfig``): one typed home, at the
bottom of ``models/`` so the evidence, link, pair and attribution models can name its
type without importing the job that holds them."""

from __future__ import annotations


class JobConfig:
    """Scale-free thresholds (fractions and z-scores) shared by the job's models.

    ``min_rel``: smallest excess over peers (or over the own baseline) worth
    flagging (0.05 = 5%); ``z_min``: how many noise sigmas that excess must
    also be; ``confirm_steps``: steps of full evidence before a culprit is
    confirmed (a CUSUM over z-scores reaching ``confirm_z = confirm_steps *
    z_min``; one-step spikes never confirm); ``lag_steps``: how far a step may
    trail the step most ranks have reached before it is judged without a rank that
    has stalled (sent no newer step while most ranks moved on ``lag_steps``);
    ``max_behind``: how far before it is judged without ranks that still report, but
    late (a host whose clock is that far ahead sends that much later in ts order);
    ``warm_steps``: samples before an own-past baseline is trusted;
    ``peer_warm_steps``: the job's first steps that peers do not judge (they need no
    past; only the first steps' one-off work, compilation and autotuning, is skipped);
    ``clean_steps``: steps without evidence before a rank's finding ends;
    ``learn_delay``: clean steps that must follow a step before the own-past
    baseline learns it (``RankState.observe``).

    ``far_rel``: how far outside its peers a rank must be to page with no change
    against its own past (a rank slow since the job's first step). Ranks doing the
    same work on the same hardware model are never identical: same-SKU GPUs
    sustain clocks a few per cent apart under power and thermal limits (cooling
    position, silicon), input pipelines and data-dependent work (sequence packing)
    add a few per cent more, and jobs recorded on real clusters show workers a
    steady 5-12 % slower than their peers from the first sample to the last. An
    excess twice the largest of those, 25 %, is no longer a difference between
    healthy parts: a throttled or degraded device, a starved host. Smaller steady
    offsets are recorded as imbalance (info) with their cost.

    ``sustain_s``: seconds a group must wait for the same member, window after window
    inside long steps (``models.substep``), before that member is confirmed without
    waiting for the step to end; a stall shorter than that never confirms.

    ``far_step_z`` and ``far_fade_ratio``: the short-step next-window rule
    (``JobState._short_substep``) confirms a member whose whole previous step was this
    many sigmas from its peers (6: a full step of CUSUM evidence, 1.5 x ``z_min``) and
    whose group still waits for it at least this share (0.75) of before (a stall's
    remainder fades); ``host_hold_steps``: steps a possible host fault (half its ranks
    rising together) holds single-rank verdicts (4; twice that once the host finding was
    confirmed); ``link_patience_steps``: extra steps a link whose transfers cannot tell
    which end is slow waits for the NIC counters before settling on the first candidate.
    """

    def __init__(self, min_rel: float = 0.05, z_min: float = 4.0, confirm_steps: int = 2,
                 lag_steps: int = 3, warm_steps: int = 10, max_behind: int = 16,
                 far_rel: float = 0.25, clean_steps: int = 5, learn_delay: int = 4,
                 sustain_s: float = 2.0, peer_warm_steps: int = 1, far_step_z: float = 6.0,
                 far_fade_ratio: float = 0.75, host_hold_steps: int = 4,
                 link_patience_steps: int = 4) -> None:
        self.min_rel = min_rel
        self.z_min = z_min
        self.confirm_steps = confirm_steps
        self.confirm_z = confirm_steps * z_min
        self.lag_steps = lag_steps
        self.max_behind = max_behind
        self.warm_steps = warm_steps
        self.far_rel = far_rel
        self.clean_steps = clean_steps
        self.learn_delay = learn_delay
        self.sustain_s = sustain_s
        self.peer_warm_steps = peer_warm_steps
        self.far_step_z = far_step_z
        self.far_fade_ratio = far_fade_ratio
        self.host_hold_steps = host_hold_steps
        self.link_patience_steps = link_patience_steps
