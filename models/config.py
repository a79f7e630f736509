"""The thresholds every model of a job reads (``JobConfig``): one typed home, at the
bottom of ``models/`` so the evidence, link, pair and attribution models can name its
type without importing the job that holds them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def _p(default: Any, doc: str, below: float | None = None, least: int | None = None) -> Any:
    """A setting: its default and one line for docs/detection.md's reference; ``below``:
    a bound the value must stay under (a share charged of a step, whose excess is
    share / (1 - share)); ``least``: the smallest value that works (a window of at least
    one step, a divisor)."""
    meta: dict[str, Any] = {"doc": doc}
    if below is not None:
        meta["below"] = below
    if least is not None:
        meta["least"] = least
    return field(default=default, metadata=meta)


def _w(default: float, doc: str) -> Any:
    """A smoothing weight: of the newest value, the rest kept (``(1 - w) * old + w *
    new``), at most 1."""
    return field(default=default, metadata={"doc": doc, "most": 1.0})


@dataclass(frozen=True)
class EvidenceConfig:
    """``[rules.evidence]``: the windowed tests of ``models.evidence`` (``Windows``,
    ``RankEvidence``, ``WaitedFor``) and the sub-step ticks that reuse them."""

    scales: tuple[int, ...] = _p((6, 12, 24, 32), "trailing windows tested, steps")
    min_fill: float = _p(0.5, "share of a window that must hold values")
    mean_floor: float = _p(0.9, "a window's mean may fall this short of the bar and still "
                           "confirm (a fault of exactly the bar measures within a few per "
                           "cent of it either way)")
    rho_prior: float = _p(0.3, "step-to-step noise correlation assumed before any is learned")
    rho_prior_n: float = _p(20.0, "steps of weight of that prior")
    rho_max: float = _p(0.8, "largest step-to-step correlation used")
    window_z_extra: float = _p(0.0, "the windowed tests' bar over z_min")
    suspect_z: float = _p(2.5, "window z from which a step is not learned (a drift)")
    suspect_learn_z: float = _p(2.0, "window z (with half min_rel of mean excess) from "
                                "which the own-past baseline learns nothing")
    noise_delay: int = _p(8, "steps a value waits before its noise is learned")
    winsor: float = _p(4.0, "learned deviations are clipped at this many sigmas")
    block_n: int = _p(8, "steps per block mean whose variance is learned")
    noise_min: int = _p(8, "clean steps before a series' noise is trusted")
    rho_alpha: float = _p(0.03, "noise learning rate (~30 steps of memory)")
    unlearned: float = _p(2.0, "noise multiplier while none is learned")
    pool_cap: float = _p(1.25, "a rank's noise: at most this times its peers' median")
    pool_floor: float = _p(0.75, "and at least this times it")
    robust_min_n: int = _p(12, "shorter windows keep the mean and sample deviation")
    robust_clip: float = _p(3.0, "a window's values are clipped this many spreads from its "
                            "median")
    long_n: int = _p(24, "windows holding this many values or more take long_z")
    long_z: float = _p(3.0, "the far verdict's bar over long windows (near-normal mean, "
                       "one-sided 3 sigma; healthy ranks peaked at 2.3 over 106 real traces)")
    present_scales: tuple[int, ...] = _p((8, 16, 32), "windows that keep a finding alive "
                                         "(present), steps")
    present_recent: int = _p(4, "present: the newest 1/this of a window must carry the "
                             "excess too")
    present_recent_min: int = _p(2, "present: and at least this many of its newest values",
                                 least=1)
    width: int = _p(32, "steps of each rank's series kept: the whole window of the far-from-"
                    "peers and steady-imbalance verdicts (scales longer than it are not "
                    "tested)", least=1)
    wait_n: int = _p(16, "waited for: judged steps in the window")
    wait_k: int = _p(12, "waited for: steps of the window the group waited for the rank")
    wait_prior_n: int = _p(32, "waited for: steps before the window, the rank's own past")
    wait_prior_min: int = _p(8, "waited for: least steps of own past")
    wait_prior_max: float = _p(0.5, "waited for: largest share of its own past (more is "
                               "the layout: steady imbalance)")
    wait_present: float = _p(0.5, "waited for: share of the window that keeps a finding "
                             "alive")
    waited_min_members: int = _p(3, "who a group waits for: groups of this many members or "
                                 "more")
    pool_min_ranks: int = _p(3, "ranks with a learned noise (a full window) before a rank's "
                             "noise is pooled with its peers'")
    onset_own_min: int = _p(3, "values among the last `onset_recent` own-past ones before "
                            "the onset is estimated on the own past, not against peers")
    onset_recent: int = _p(6, "latest steps whose mean excess stands for the shift when a "
                           "finding's onset is estimated without one")
    self_driven_steps: int = _p(4, "latest steps over which a confirmed rank's excess over its "
                                "own past is compared with its excess over its peers")
    self_driven_share: float = _p(0.5, "the excess is the rank's own (not its peers' change) "
                                  "when that over its own past is at least this share of "
                                  "that over its peers")
    wait_share_max: float = _p(0.9, "largest share of a step charged to a rank its group "
                               "waits for (an excess of share / (1 - share): 9x at most)",
                               below=1.0)
    fast_max: float = _p(0.9, "a relative excess (against peers, own past or in-step "
                         "ticks) is taken as at least minus this before its log (a value "
                         "10x faster than its reference)", below=1.0)

    @property
    def long_scales(self) -> tuple[int, ...]:
        return tuple(n for n in self.scales if n >= self.long_n)

    @property
    def waited_bar(self) -> float:
        """The share of its last steps its group waited for a rank that makes it a
        rank fault (``wait_k / wait_n``)."""
        return self.wait_k / self.wait_n


@dataclass(frozen=True)
class LinkConfig:
    """``[rules.links]``: collective groups (``models.links``)."""

    run_max: int = _p(32, "steps of a group's evidence run kept (its fade check)")
    clock_gain: float = _p(0.5, "share of a step's measured clock offset taken (the hosts' "
                           "estimates depend on each other: a full step would overshoot)")
    groups_min: int = _p(4, "groups with a learned cost before groups are compared with "
                         "each other")
    noise_floor: float = _p(0.02, "relative noise below which a group's cost is not trusted "
                            "to be")
    cost_window: int = _p(32, "steps in the rolling median of a group's usual cost per byte")
    pending_steps: int = _p(4, "steps past the newest judged one that a collective missing "
                            "members, or a step's comm windows, are kept before they are "
                            "dropped unjudged")


@dataclass(frozen=True)
class CauseConfig:
    """``[rules.causes]``: root causes from telemetry (``models.rootcause``, NICs in
    ``models.links``)."""

    nic_agree: int = _p(2, "NIC counters that must agree before a port counts as congested "
                        "or erroring")
    nic_outlier: float = _p(20.0, "a NIC is congested / erroring when those counters grow "
                            "this many times faster than the job's typical NIC (incast "
                            "bursts on healthy ports reach ~30x for one sample, smoothed "
                            "below this)")
    nics_min: int = _p(4, "NICs of the job before any stands out")
    ref_floor: float = _p(0.01, "a counter's reference rate is at least this share of the "
                          "device's own (a ratio of 100 at most)")
    sparse_floor_per_s: float = _p(1.0 / 60.0, "error counters that stay at zero on "
                                   "healthy devices count from this rate up (one a minute)")
    error_ratio: float = _p(5.0, "GPU error / PCIe replay counters this many times the "
                            "peers' rate are a fault (score 1)")
    gauge_floor: float = _p(0.02, "a gauge's spread among peers is at least this share of "
                            "their median")
    gauge_z: float = _p(4.0, "robust z of a gauge against the peers (temperature, power "
                        "limit, PCIe link, SM clock, NIC speed) that is a fault (score 1)")
    cpu_ratio: float = _p(1.5, "host load over both its peers and its own past that is "
                          "CPU contention (score 1)")
    reason_share: float = _p(0.5, "share of recent samples with a clock-event reason "
                             "(thermal, power, hw slowdown) that is throttling")
    reason_peer_max: float = _p(0.25, "and the typical peer's share under this")
    every_steps: int = _p(3, "judged steps a finding's root cause is kept before it is "
                          "looked up again")
    score_max: float = _p(5.0, "largest score of a GPU error counter or of CPU contention "
                          "(scores grow with the ratio over its bar)")
    replay_score_max: float = _p(3.0, "largest score of PCIe replays")
    xid_score: float = _p(5.0, "score of a GPU that reported an Xid error (the strongest "
                          "explanation of its tier)")
    pcie_down_score: float = _p(4.0, "score of a PCIe link running under its maximum "
                                "generation or width")
    pcie_gauge_score: float = _p(3.0, "score of a PCIe generation or width far under the "
                                 "peers' (robust z past gauge_z)")
    reason_score: float = _p(3.0, "score of a thermal or power clock-event reason held "
                             "(reason_share)")
    hw_slowdown_score: float = _p(2.0, "score of a hardware-slowdown clock-event reason "
                                  "held (reason_share) with no clock gauge past gauge_z")
    cpu_ref_floor: float = _p(0.001, "a host's load reference is at least this share of the "
                              "load (a ratio of 1000 at most)")
    input_stall_share: float = _p(0.5, "a culprit's extra time is an input stall when at least "
                                  "this share of it is spent waiting for data")
    input_stall_score: float = _p(2.0, "an input stall's score per unit of that share (against "
                                  "the telemetry causes' scores)")


@dataclass(frozen=True)
class CostConfig:
    """``[rules.cost]``: the job's step-time history behind a finding's cost
    (``models.attribution``, ``models.p2p``)."""

    history_steps: int = _p(64, "steps of the job's step time kept for pre-onset baselines")
    base_steps: int = _p(16, "the job's steps before the onset whose mean is its usual "
                         "step time")
    base_min_steps: int = _p(4, "fewer steps before the onset give no such mean (the "
                             "job's rolling median instead)")
    recent_alpha: float = _w(0.3, "weight of the newest step in the job's recent step time "
                             "(a finding's cost with no clean past)")
    clean_window: int = _p(32, "steps in the rolling median of the job's step time while no "
                           "rank or pair stands out (its usual step time)")


@dataclass(frozen=True)
class RankConfig:
    """``[rules.ranks]``: each rank's baselines and the own-past reference
    (``models.ranks``, ``models.job``)."""

    baseline_alpha: float = _w(0.05, "weight of the newest step in a rank's step, own-work, "
                               "comm and input baselines (~20 steps of memory)")
    baseline_window: int = _p(32, "steps in the rolling median of a rank's own work (its "
                              "usual position)")
    own_ref_min: int = _p(4, "ranks with a learned own past that make the own-past "
                          "reference (all but one in smaller jobs)")
    jobwide_share: float = _p(0.125, "more than this share of the ranks (and more than "
                              "jobwide_min), on several hosts, rising against their own past "
                              "together is a job-wide change: only peers judge that step")
    jobwide_min: int = _p(2, "and more than this many ranks")
    idle_steps: int = _p(20, "a job that sent nothing for this many of its step times (and "
                         "[detector] job_idle_s) has ended")
    share_steps: int = _p(8, "steps on one set of the ranks' shares of the batch (steps "
                          "carrying samples) before its median work counts in the fixed "
                          "per-step cost's fit (models.shares); also how often it is fitted")
    share_keep: int = _p(32, "newest steps kept per set of shares")
    share_sets: int = _p(8, "sets of shares kept (the most recently used)")
    share_spread: float = _p(0.05, "least spread of a rank's shares, as a fraction of the "
                             "largest, for its line to estimate the fixed cost")
    share_fixed_max: float = _p(0.5, "the fixed cost is at most this share of the step's "
                                "median work")
    work_alpha: float = _w(0.2, "weight of the newest step in a rank's smoothed own work "
                           "(its recent position)")
    noise_alpha: float = _w(0.1, "weight of the newest step in the peers' relative spread "
                            "(~10 steps of memory)")
    noise_floor: float = _p(0.01, "the peers' relative spread is taken as at least this "
                            "(fraction)")
    excess_alpha: float = _w(0.1, "weight of the newest step in a finding's excess seconds")
    rel_alpha: float = _w(0.2, "weight of the newest step in a finding's excess over its "
                          "reference")
    imb_alpha: float = _w(0.2, "weight of the newest step in a steady imbalance's gap")


@dataclass(frozen=True)
class SubstepConfig:
    """``[rules.substep]``: evidence inside long steps (``models.substep``)."""

    width: int = _p(32, "ticks kept per member")
    min_ops: int = _p(3, "ops of the group per member in a tick (windows add up until then)")
    min_spread: int = _p(2, "windows of a step with ops of the group (fewer: the ops are "
                         "bunched at the step's end, no in-step evidence)")
    min_work: float = _p(0.2, "least share of a member's time spent working between the ops")
    sigma_floor: float = _p(0.02, "per-tick noise floor (fraction)")
    long_windows: float = _p(1.5, "a step of at least this many producer windows is long "
                             "(judged inside the step; also for p2p pairs)")
    episode_emits: int = _p(4, "judgements from inside a step per episode of a member "
                            "confirmed there (the policy grades it by the seconds they span)")
    nostep_windows: int = _p(2, "producer windows in a derived step, for a job that sends "
                             "no step events")
    nostep_learn: int = _p(4, "windows one rank must send before a derived step's length is "
                           "learned")
    min_ticks: int = _p(2, "ticks in the shortest tick window tested (the shortest spans "
                        "sustain_s, and at least this many)", least=1)
    span_ratio: int = _p(4, "the longest tick window tested is this many times the shortest "
                         "(width at most); one twice the shortest lies between", least=1)
    window_alpha: float = _w(0.1, "weight of the newest producer window in its learned "
                             "length")
    spread_alpha: float = _w(0.1, "weight of the newest tick in a group's learned spread")


@dataclass(frozen=True)
class P2PConfig:
    """``[rules.p2p]``: point-to-point rank pairs (``models.p2p``)."""

    noise_floor: float = _p(0.02, "relative noise below which a pair's cost is not trusted "
                            "to be")
    peers_min: int = _p(4, "pairs of one op size needed for a comparison across pairs")
    size_bucket: float = _p(0.5, "log2 width of an op-size class (ops of similar size "
                            "compare)")
    warm_min: int = _p(3, "pairs with a learned cost before pairs are compared with each "
                       "other")
    cost_window: int = _p(32, "steps in the rolling median of a pair's usual seconds per byte")
    pending_steps: int = _p(4, "steps past the newest judged one that a step's sends and "
                            "recvs whose pair is not complete are kept before they are "
                            "dropped unjudged")
    mid_steps: int = _p(5, "the job's latest steps whose median step time says whether its "
                        "steps are long ([rules.substep] long_windows): pairs judged window "
                        "by window", least=1)
    recent_steps: int = _p(8, "a slow pair with no clean past of the job: its slowdown is "
                           "against the median of the job's latest this many step times",
                           least=1)
    window_alpha: float = _w(0.1, "weight of the newest producer window in its learned "
                             "length")
    pair_alpha: float = _w(0.2, "weight of the newest step in a pair's op size, excess and "
                           "extra seconds")
    rate_max: float = _p(0.9, "largest share of a second charged to a slow pair's extra "
                         "transfer time (a slowdown of rate / (1 - rate): 9x at most)",
                         below=1.0)


@dataclass(frozen=True)
class ChangepointConfig:
    """``[rules.changepoint]``: the job's step-time change points (``models.changepoint``,
    BOCPD on log step time)."""

    hazard: float = _p(1 / 250, "prior chance of a change at each step")
    max_run: int = _p(100, "run lengths kept in the posterior")
    prior_scale: float = _p(0.02, "prior spread of a run (log step time)")
    prior_kappa: float = _p(0.1, "weight of the prior mean, in samples")
    outlier: float = _p(0.02, "share of samples that are wild (one spike does not end a run)")
    outlier_scale: float = _p(1.0, "spread of those wild samples (log step time)")
    threshold: float = _p(0.8, "posterior mass on recent runs that confirms a change")
    window: int = _p(8, "a change is recent while its run is this many samples or fewer")
    min_run: int = _p(2, "and at least this many")
    min_shift: float = _p(0.049, "least shift of the recent mean from the baseline (log: "
                          "a 5 % slowdown)")
    baseline_alpha: float = _w(0.1, "weight of the newest sample in the baseline")


SECTIONS: dict[str, type] = {"evidence": EvidenceConfig, "links": LinkConfig,
                             "causes": CauseConfig, "cost": CostConfig, "ranks": RankConfig,
                             "substep": SubstepConfig, "p2p": P2PConfig,
                             "changepoint": ChangepointConfig}


@dataclass(frozen=True)
class DetectorConfig:
    """``[detector]``: settings of the whole detector, not of one job (no per-job
    override): the telemetry every job's root causes read and when a job has ended."""

    job_idle_s: float = _p(300.0, "event-time seconds without a step, comm or collective "
                           "after which a job has ended")
    telemetry_delay_s: float = _p(1.0, "how far device samples may trail the step events (the "
                                  "collectors' sample period): a step judged at T uses the "
                                  "samples up to T minus this")
    rate_alpha: float = _w(0.3, "weight of the newest telemetry counter rate (a few samples "
                           "of memory)")
    gauge_alpha: float = _w(0.3, "weight of the newest telemetry gauge value")
    first_samples: int = _p(3, "a device's first samples, its own past (``first``)")
    idle_sweeps: int = _p(8, "looks per job_idle_s for jobs that have ended (a job ends "
                          "between job_idle_s and 1/this of it more after its last event)",
                          least=1)
    telemetry_queue_cap: int = _p(1 << 17, "device samples queued (all hosts) beyond which each "
                                  "host's older half is applied before the steps cut it: the "
                                  "queue's memory bound (raise it for clusters of 10,000+ "
                                  "hosts, whose samples reach it within seconds)",
                                  least=1)


def section_docs(cls: type) -> list[tuple[str, Any, str]]:
    """(key, default, doc) of each setting of a section."""
    return [(f.name, f.default, f.metadata.get("doc", "")) for f in fields(cls)]


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

    Sections (``SECTIONS``, TOML ``[rules.NAME]``): ``evidence`` (``EvidenceConfig``),
    ``links`` (``LinkConfig``), ``causes`` (``CauseConfig``), ``cost`` (``CostConfig``),
    ``ranks`` (``RankConfig``), ``substep`` (``SubstepConfig``), ``p2p`` (``P2PConfig``),
    ``changepoint`` (``ChangepointConfig``).
    """

    # The defaults of the sections: a JobConfig unpickled from before a section existed
    # reads these (the values it ran with).
    evidence: EvidenceConfig = EvidenceConfig()
    links: LinkConfig = LinkConfig()
    causes: CauseConfig = CauseConfig()
    cost: CostConfig = CostConfig()
    ranks: RankConfig = RankConfig()
    substep: SubstepConfig = SubstepConfig()
    p2p: P2PConfig = P2PConfig()
    changepoint: ChangepointConfig = ChangepointConfig()

    def __init__(self, min_rel: float = 0.05, z_min: float = 4.0, confirm_steps: int = 2,
                 lag_steps: int = 3, warm_steps: int = 10, max_behind: int = 16,
                 far_rel: float = 0.25, clean_steps: int = 5, learn_delay: int = 4,
                 sustain_s: float = 2.0, peer_warm_steps: int = 1, far_step_z: float = 6.0,
                 far_fade_ratio: float = 0.75, host_hold_steps: int = 4,
                 link_patience_steps: int = 4, evidence: EvidenceConfig | None = None,
                 links: LinkConfig | None = None, causes: CauseConfig | None = None,
                 cost: CostConfig | None = None, ranks: RankConfig | None = None,
                 substep: SubstepConfig | None = None, p2p: P2PConfig | None = None,
                 changepoint: ChangepointConfig | None = None) -> None:
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
        self.evidence = evidence or EvidenceConfig()
        self.links = links or LinkConfig()
        self.causes = causes or CauseConfig()
        self.cost = cost or CostConfig()
        self.ranks = ranks or RankConfig()
        self.substep = substep or SubstepConfig()
        self.p2p = p2p or P2PConfig()
        self.changepoint = changepoint or ChangepointConfig()
