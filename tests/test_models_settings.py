"""One configuration tree (``models.settings.DetectionConfig``): TOML files, per-job
overrides, one-line errors, and no threshold outside it."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from failslow.models.pipeline import Detector
from failslow.models.settings import DetectionConfig, DetectionConfigError

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "detect.toml"
    p.write_text(text)
    return str(p)


def test_a_file_sets_defaults_and_per_job_overrides(tmp_path):
    cfg = DetectionConfig.load(write(tmp_path, """
[rules]
z_min = 5
far_rel = 0.3
[policy]
page_steps = 6
critical_gpu_hours = 2.0
[[override]]
jobs = "llm-*"
policy = {page_steps = 3}
rules = {min_rel = 0.1}
"""))
    assert cfg.job_config().z_min == 5.0 and cfg.job_config().far_rel == 0.3
    assert cfg.for_job("bert").policy.page_steps == 6
    llm = cfg.for_job("llm-70b")
    assert llm.policy.page_steps == 3 and llm.policy.critical_gpu_hours == 2.0
    assert llm.job_config().min_rel == 0.1 and llm.job_config().z_min == 5.0
    det = Detector(config=cfg)
    assert det.tracker.cfg("llm-1").page_steps == 3 and det.tracker.cfg("x").page_steps == 6
    assert det._job_cfg("llm-1").min_rel == 0.1 and det._job_cfg("x").min_rel == 0.05


@pytest.mark.parametrize("text, words", [
    ("[policy]\npage_stepz = 2\n", "policy: unknown key 'page_stepz'"),
    ("[rules]\nz_min = 'high'\n", "rules.z_min: 'high' is not a float"),
    ("[rules]\nconfirm_steps = 2.5\n", "rules.confirm_steps: 2.5 is not a int"),
    ("[policy]\npage_steps = 0\n", "policy.page_steps must be >= 1"),
    ("[policy]\nback_pct = -1\n", "policy.back_pct: -1.0 must be >= 0"),
    ("[polcy]\n", "unknown table 'polcy'"),
    ("[[override]]\npolicy = {page_steps = 3}\n", "override[0]: needs jobs"),
    ("[[override]]\njobs = 'a*'\npolicy = {nope = 3}\n", "override[0].policy: unknown key"),
    ("page_steps = [\n", "not TOML"),
    ("[rules.evidence]\nscales = [6, 0.5]\n", "rules.evidence.scales: [6, 0.5] is not a list"),
    ("[rules.links]\nnic_outlyer = 30\n", "rules.links: unknown key 'nic_outlyer'"),
    ("[rules]\nevidence = 3\n", "rules.evidence: expected a table"),
    ("[detector]\nrate_alpha = 'x'\n", "detector.rate_alpha: 'x' is not a float"),
    ("[[override]]\njobs = 'a*'\ndetector = {rate_alpha = 0.5}\n",
     "override[0]: [detector] is the whole detector's, not per job"),
    ("[[override]]\njobs = 'a*'\nrules.evidence.long_z = -1\n",
     "override[0].rules.evidence.long_z: -1.0 must be >= 0"),
    ("[rules.ranks]\nwork_alpha = 1.5\n", "rules.ranks.work_alpha: 1.5 must be <= 1"),
    ("[rules.evidence]\nfast_max = 1\n", "rules.evidence.fast_max: 1.0 must be < 1"),
    ("[detector]\nrate_alpha = 2\n", "detector.rate_alpha: 2.0 must be <= 1"),
    ("[policy]\nlag_max = 1.0\n", "policy.lag_max must be >= 0 and < 1"),
    ("[rules.changepoint]\nwindow = 0.5\n", "rules.changepoint.window: 0.5 is not a int"),
    ("[rules.evidence]\nwidth = 3.5\n", "rules.evidence.width: 3.5 is not a int"),
    ("[rules.p2p]\nmid_steps = 0\n", "rules.p2p.mid_steps: 0 must be >= 1"),
    ("[detector]\nidle_sweeps = 0\n", "detector.idle_sweeps: 0 must be >= 1"),
    ("[rules.p2p]\npending_steps = -1\n", "rules.p2p.pending_steps: -1 must be >= 0"),
    ("[rules.substep]\nmin_ticks = 'two'\n", "rules.substep.min_ticks: 'two' is not a int"),
    ("[policy]\nopen_steps_max = 0\n", "policy.open_steps_max must be >= 1"),
    ("[mitigate]\nhold_steps = 0\n", "mitigate.hold_steps: 0 is not an integer >= 1"),
    ("[mitigate]\nstale_s = 'long'\n", "mitigate.stale_s: 'long' is not a number"),
    ("[mitigate]\nrefine_gain = 0\n", "mitigate.refine_gain: 0 is not a positive number"),
    ("[mitigate]\neffect_steps = 2.5\n", "mitigate.effect_steps: 2.5 is not an integer >= 1"),
])
def test_an_unknown_key_or_a_bad_value_is_one_line(tmp_path, text, words):
    with pytest.raises(DetectionConfigError) as e:
        DetectionConfig.load(write(tmp_path, text))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_rule_sections_reach_every_model_of_the_job(tmp_path):
    """``[rules.evidence]`` / ``[rules.causes]`` and per-job overrides of them land in the
    job's windows, its waited-for record and its link thresholds."""
    from failslow.models.job import JobState

    cfg = DetectionConfig.load(write(tmp_path, """
[rules.evidence]
long_z = 2.5
scales = [6, 12]
[rules.causes]
nic_outlier = 30
[[override]]
jobs = "llm-*"
rules.evidence.noise_delay = 4
"""))
    det = Detector(config=cfg)
    llm, other = det._job_cfg("llm-1"), det._job_cfg("bert")
    assert (llm.evidence.noise_delay, llm.evidence.long_z, llm.evidence.scales) == (4, 2.5, (6, 12))
    assert other.evidence.noise_delay == 8 and other.causes.nic_outlier == 30.0
    job = JobState("llm-1", llm)
    assert job.evidence.own.p.noise_delay == 4 and job.evidence.peer.p.scales == (6, 12)
    assert job.evidence.waited.p is llm.evidence and job.links.cfg.causes.nic_outlier == 30.0
    whole = Detector(config=DetectionConfig.from_mapping(
        {"detector": {"rate_alpha": 0.5, "job_idle_s": 60.0}}))
    assert whole.store.p.rate_alpha == 0.5 and whole.job_idle_s == 60.0
    described = cfg.describe()["rules"]
    assert described["evidence"]["long_z"] == 2.5 and described["links"]["run_max"] == 32


def test_docs_list_every_key_of_the_tree():
    text = (ROOT / "docs" / "detection.md").read_text()
    described = DetectionConfig().describe()
    missing = [f"{sec}.{k}" for sec in ("rules", "policy", "planner")
               for k in described[sec] if not re.search(rf"\b{k}\b", text)]
    assert not missing, f"docs/detection.md does not list {missing}"
    from failslow.models.settings import reference_markdown
    assert reference_markdown() in text, \
        "docs/detection.md: paste models.settings.reference_markdown() (the sections' tables)"


def test_nic_outlier_bar_decides_which_ports_stand_out():
    from failslow.models.config import CauseConfig
    from failslow.models.links import outlier_nics
    from failslow.models.telemetry import Device

    nics = {}
    for h in range(8):
        d = Device()
        d.rates = {"rx_pause_total": 1.0, "cnp_sent_total": 1.0}
        nics[(f"h{h}", "mlx5_0", 0)] = d
    nics[("h3", "mlx5_0", 0)].rates = {"rx_pause_total": 25.0, "cnp_sent_total": 25.0}
    assert outlier_nics(nics) == [("h3", "mlx5_0")]                     # 25x >= 20x
    assert outlier_nics(nics, CauseConfig(nic_outlier=30.0)) == []       # 25x < 30x
    assert outlier_nics(nics, CauseConfig(nic_agree=3)) == []            # two counters agree


def test_telemetry_queue_cap_bounds_the_queue_and_is_set_from_the_tree():
    from failslow.simulator import SCENARIOS, simulate

    events = list(simulate(SCENARIOS["gpu_thermal_30"], seed=0).events())

    def peak(det: Detector) -> int:
        most = 0
        for i in range(0, len(events), 200):
            det.process_batch(events[i:i + 200])
            most = max(most, det._queued)
        return most

    small = Detector(config=DetectionConfig.from_mapping(
        {"detector": {"telemetry_queue_cap": 20}}))
    assert small.telemetry_queue_cap == 20
    unbounded = peak(Detector())                  # the default cap is far above this job
    assert unbounded > 40
    assert peak(small) < unbounded                # older halves applied past 20


def test_a_job_keeps_the_step_ends_its_policy_counts():
    default = Detector().tracker
    wide = Detector(config=DetectionConfig.from_mapping(
        {"policy": {"period_steps": 40, "open_steps_max": 50}})).tracker
    for k in range(80):
        default.period("j", float(k))
        wide.period("j", float(k))
    assert len(default.ends["j"]) == 33
    assert len(wide.ends["j"]) == 51


@pytest.mark.parametrize("command", [["detect", "TRACE"], ["worker"], ["demo"]])
def test_each_command_reads_the_file_and_says_what_is_wrong_in_one_line(tmp_path, command):
    bad = write(tmp_path, "[policy]\npage_stepz = 2\n")
    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    argv = [str(trace) if a == "TRACE" else a for a in command]
    env = {**os.environ, "FAILSLOW_HOME": str(tmp_path / "home")}
    run = subprocess.run([sys.executable, "-m", "failslow.cli", *argv, "--config", bad],
                         capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown key 'page_stepz'" in lines[0], run.stderr


def test_detect_applies_the_file(tmp_path):
    """The same trace, the default policy and one that never pages (page_steps huge)."""
    from failslow.simulator import SCENARIOS, simulate

    trace = tmp_path / "t.jsonl"
    simulate(SCENARIOS["gpu_errors_40"], seed=0).write_jsonl(trace)
    quiet = write(tmp_path, "[policy]\npage_steps = 100000\nresolve_max_steps = 100000\n")
    sev = {}
    for name, extra in (("default", []), ("quiet", ["--config", quiet])):
        run = subprocess.run([sys.executable, "-m", "failslow.cli", "detect", str(trace),
                              *extra], capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert run.returncode == 0, run.stderr
        sev[name] = {json.loads(x)["severity"] for x in run.stdout.splitlines()}
    assert sev["default"] - {"info"} and sev["quiet"] == {"info"}


# The scans below read every module of models/ but the tree's: its modules and, in a
# module that also holds code, its classes.
TREE_MODULES = ("settings", "policy", "config")
TREE_CLASSES = {"actions": {"MitigationConfig"}}     # [mitigate]


def _parse(path: Path) -> ast.Module:
    """A module of models/, less the classes that are the tree (``TREE_CLASSES``)."""
    tree = ast.parse(path.read_text())
    tree.body = [n for n in tree.body if not (isinstance(n, ast.ClassDef)
                                              and n.name in TREE_CLASSES.get(path.stem, ()))]
    return tree


# Module-level numbers in models/ that are not thresholds: sizes of bounded buffers and
# histories, array layout, units. Anything that decides (a threshold) lives in the tree
# (``JobConfig`` and its sections, ``PolicyConfig``, ``Planner``, ``DetectorConfig``;
# docs/detection.md lists every key).
NOT_THRESHOLDS = {
    "incidents": {"UNEXPLAINED_MAX", "ENDS_N"},
    # the snapshot's version, its migrations by version, defaults of fields added to it
    "migrate": {"STATE_VERSION", "STEPS", "INCIDENT_SLOTS"},
    # constants of the normal law (MAD, lower-half MAD and IQR per sigma): units, not bars
    "evidence": {"ROBUST_MAD"},
    "peers": {"LOWER_HALF_MAD",
              "PARTITION_MIN"},   # sort or partition: the same order statistics either way
    "stats": {"IQR_PER_SIGMA"},
    # array layout: the header entries of an open collective and their indexes
    "alignment": {"HEAD", "STEP", "GROUP", "OP", "BYTES"},
    # NVML clock-event reason bitmasks (wire format); GPU samples held back before a
    # flush (a batching bound: the same state either way)
    "telemetry": {"REASON_GROUPS", "PENDING_MAX"},
    # deployment sizing from FAILSLOW_SHARD_RANKS: how a job is split over workers
    "shard": {"SHARD_RANKS"},
    # how stale P2PMonitor._quartile_low's sorted copy may grow (a cache: its bound only
    # skips lower_half_ref, which decides); the offset that makes an i32 rank a key's
    # 32 bits (``wkey``)
    "p2p": {"SNAP_STALE", "RANK_OFF"},
    # rank-0 steps between two looks for ended jobs (forget_s decides which have ended)
    "actions": {"PRUNE_EVERY"},
    # a step event's fields read per rank and the value of one that is absent (wire format)
    "job": {"_GATHER"},
}


def _module_numbers(path: Path) -> set[str]:
    """Upper-case module-level names assigned an expression holding a number (also
    ``A, B = 1, 2``)."""
    names = set()
    for node in _parse(path).body:
        if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        found = [n.id for t in targets for n in ast.walk(t)
                 if isinstance(n, ast.Name) and n.id.isupper()]
        nums = [n for n in ast.walk(node.value) if isinstance(n, ast.Constant)
                and isinstance(n.value, int | float) and not isinstance(n.value, bool)]
        if found and nums:
            names.update(found)
    return names


def _scanned(scan: Callable[[Path], set]) -> set:
    """What ``scan(module path)`` finds over every module of models/ outside the tree."""
    found: set = set()
    for path in sorted((ROOT / "models").glob("*.py")):
        if path.stem not in TREE_MODULES:
            found |= scan(path)
    return found


def test_no_module_threshold_in_models():
    found = _scanned(lambda path: {f"{path.stem}.{n}" for n in _module_numbers(path)
                                   - NOT_THRESHOLDS.get(path.stem, set())})
    assert not found, f"thresholds outside the config tree (models.settings): {sorted(found)}"


# Bare numbers in comparisons (issue 30 item 4: "no constant or bare number outside the
# tree decides anything"). Allowed anywhere: 0, 1, 2 and 0.5 (signs, halves and doubles),
# and numbers inside a subscript (array columns and slices). Allowed per module, each for
# its reason: (module, value).
COMPARED_NOT_THRESHOLDS = {
    ("incidents", 100.0): "percent <-> fraction",
    ("peers", 1e-09): "float tolerance: a value equal to the bar up to rounding",
    ("p2p", 1e-09): "float tolerance: a span equal to sustain_s up to rounding",
    ("substep", 1e-09): "float tolerance: windows that end together up to rounding",
    ("comm", 1024): "a Python loop or numpy by size: the same sums either way",
}
FREE_NUMBERS = {0, 1, 2, 0.5}


def _compared_numbers(path: Path) -> set[tuple[str, float]]:
    """(module, value) of each numeric literal inside a comparison, outside subscripts."""
    found = set()
    for node in ast.walk(_parse(path)):
        if not isinstance(node, ast.Compare):
            continue
        index = {id(n) for sub in ast.walk(node) if isinstance(sub, ast.Subscript)
                 for n in ast.walk(sub.slice)}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, int | float) \
                    and not isinstance(sub.value, bool) and sub.value not in FREE_NUMBERS \
                    and id(sub) not in index:
                found.add((path.stem, sub.value))
    return found


def test_no_bare_number_in_a_comparison_in_models():
    found = _scanned(_compared_numbers)
    new = sorted(found - set(COMPARED_NOT_THRESHOLDS))
    assert not new, f"bare numbers compared in models/ (move them into the tree): {new}"


def test_the_comparison_scan_sees_a_bare_threshold(tmp_path):
    p = tmp_path / "mod.py"
    p.write_text("def f(x, a):\n    return x >= 4 and a[3] > 0.5 and x < 2 * a[-6:].sum()\n")
    assert _compared_numbers(p) == {("mod", 4)}



# Smoothing weights, clamps, floors, scores and window sizes written as bare numbers
# (issue 30 item 4): a float other than FREE_NUMBERS (or its negative) in arithmetic, as
# an argument of a call, as an element of a tuple, list or dict or as a value assigned
# (a cause's score: ``(3.0, evidence)``), and any number handed to a class (an
# estimator's window or weight: ``RollingMedian(32)``, ``EWMeanVar(0.1)``), outside
# subscripts. The defaults of the
# config dataclasses (models/config.py, models/policy.py, ...) are the tree itself.
# Allowed anywhere: units and float guards against a division by zero (not bars).
UNITS_AND_GUARDS = {100.0, 3600.0, 1e-9, 1e-12}
# Allowed per module, each for its reason: (module, value).
ARGUMENT_NOT_THRESHOLDS = {
    ("peers", 0.6745): "the normal law: MAD per sigma",
    ("rootcause", 1.4826): "the normal law: sigma per MAD",
    ("stats", 0.25): "quartiles (the IQR)",
    ("stats", 0.75): "quartiles (the IQR)",
    # module constants, each allow-listed in NOT_THRESHOLDS for its reason
    ("evidence", 1.4826): "ROBUST_MAD: the normal law",
    ("peers", 0.3991): "LOWER_HALF_MAD: the normal law",
    ("stats", 1.349): "IQR_PER_SIGMA: the normal law",
    ("incidents", 1e300): "a time before any: never re-attributed yet",
}


def _argument_numbers(path: Path) -> set[tuple[str, float]]:
    """(module, value) of each bare smoothing weight, clamp or estimator size."""
    tree = _parse(path)
    index = {id(n) for sub in ast.walk(tree) if isinstance(sub, ast.Subscript)
             for n in ast.walk(sub.slice)}

    def number(node: ast.AST) -> ast.Constant | None:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            node = node.operand
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) \
                and not isinstance(node.value, bool) and id(node) not in index:
            return node
        return None

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            operands, to_class = [node.left, node.right], False
        elif isinstance(node, ast.Call):
            operands = [*node.args, *(k.value for k in node.keywords)]
            name = node.func.attr if isinstance(node.func, ast.Attribute) else \
                getattr(node.func, "id", "")
            to_class = name[:1].isupper()
        elif isinstance(node, ast.Tuple | ast.List):
            operands, to_class = list(node.elts), False
        elif isinstance(node, ast.Dict):
            operands, to_class = [v for v in node.values if v is not None], False
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.Return) \
                and node.value is not None:
            operands, to_class = [node.value], False
        else:
            continue
        for op in operands:
            c = number(op)
            if c is None or c.value in FREE_NUMBERS or c.value in UNITS_AND_GUARDS:
                continue
            if isinstance(c.value, float) or to_class:
                found.add((path.stem, c.value))
    return found


def test_no_bare_smoothing_weight_clamp_or_window_in_models():
    found = _scanned(_argument_numbers)
    new = sorted(found - set(ARGUMENT_NOT_THRESHOLDS))
    assert not new, ("smoothing weights, clamps or window sizes written as numbers in "
                     f"models/ (move them into the tree): {new}")


def test_the_argument_scan_sees_weights_clamps_and_windows(tmp_path):
    p = tmp_path / "mod.py"
    p.write_text("def f(x, a, m):\n"
                 "    m = RollingMedian(32)\n"
                 "    y = 0.8 * a + 0.2 * x + round(x, 3) + a[0.7] + max(x, -0.9)\n"
                 "    s = {'cause': (3.0, {}), 'n': 4}\n"
                 "    return min(x, 0.5) / max(a, 1e-9) * 100.0 + np.clip(x, 0.0, 1.0)\n")
    assert _argument_numbers(p) == {("mod", 32), ("mod", 0.8), ("mod", 0.2), ("mod", 0.9),
                                    ("mod", 3.0)}


def test_weights_windows_and_the_changepoint_settings_reach_the_models(tmp_path):
    """The keys that replaced bare smoothing weights and window sizes land in the
    estimators a job builds (a change of one changes what they hold)."""
    from failslow.models.job import JobState
    from failslow.models.p2p import P2PMonitor

    cfg = DetectionConfig.load(write(tmp_path, """
[rules.changepoint]
threshold = 0.7
window = 6
[rules.ranks]
noise_alpha = 0.3
[rules.cost]
clean_window = 16
[rules.links]
cost_window = 24
"""))
    job = JobState("j", cfg.job_config())
    assert (job.cpd.threshold, job.cpd.window, job.cpd.recent.maxlen) == (0.7, 6, 6)
    assert job.cpd.clone().p == cfg.job_config().changepoint
    assert job.noise.alpha == 0.3 and job.job_clean.window == 16
    assert job.links.table.cost.window == 24
    assert P2PMonitor(cfg.job_config()).clean.window == 16
    assert cfg.describe()["rules"]["changepoint"]["hazard"] == 1 / 250


# Parameter defaults that decide (issue 30 item 4): a function's or method's parameter
# whose default is a number (int or float, not a bool, not 0, 1, -1 or None) picks a
# threshold for every caller that leaves it out (``peer_scores(floor=0.01)``,
# ``EWMeanVar(alpha=0.1)``, ``CommWindows(max_age=4)``). Such a parameter has no default
# (its callers pass the tree's value) or its default is the tree's, read from the config
# dataclass (``max_age: int = LinkConfig.pending_steps``), never a literal. The
# constructors whose parameters are a section of the tree themselves are exempt:
DEFAULTS_ARE_THE_TREE = {
    ("mitigation", "Planner.__init__"): "[planner] (settings._params(Planner))",
}
# Allowed per (module, function, parameter), each for its reason.
DEFAULT_NOT_THRESHOLDS = {
    ("peers", "peer_scores", "min_group"): "a group of one has no peer: the definition of "
                                          "a peer (two members), not a bar",
}
FREE_DEFAULTS = {0, 1, -1}


def _default_numbers(path: Path) -> set[tuple[str, str, str, float]]:
    """(module, function, parameter, value) of each number written as a parameter's
    default (``Class.method`` for methods)."""
    found = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                name = prefix + getattr(child, "name", "<lambda>")
                a = child.args
                pos = [*a.posonlyargs, *a.args]
                pairs = [*zip(pos[len(pos) - len(a.defaults):], a.defaults, strict=True),
                         *((k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
                           if d is not None)]
                for arg, d in pairs:
                    v = d.operand if isinstance(d, ast.UnaryOp) \
                        and isinstance(d.op, ast.USub) else d
                    if isinstance(v, ast.Constant) and isinstance(v.value, int | float) \
                            and not isinstance(v.value, bool):
                        value = -v.value if v is not d else v.value
                        if value not in FREE_DEFAULTS:
                            found.add((path.stem, name, arg.arg, value))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(_parse(path), "")
    return found


def test_no_number_as_a_parameter_default_in_models():
    found = _scanned(_default_numbers)
    new = sorted(f for f in found if f[:2] not in DEFAULTS_ARE_THE_TREE
                 and f[:3] not in DEFAULT_NOT_THRESHOLDS)
    assert not new, ("parameter defaults that decide, written as numbers in models/ "
                     f"(take the tree's value): {new}")


def test_the_default_scan_sees_a_number_as_a_default(tmp_path):
    p = tmp_path / "mod.py"
    p.write_text("class A:\n"
                 "    def __init__(self, x, width=32, on=True, n=1, k=-1, lo=-0.5,\n"
                 "                 floor=Cfg.floor, *, alpha=0.1, m=None):\n"
                 "        f = lambda y, w=4: y\n"
                 "def g(a, b=0.0, c=2):\n"
                 "    pass\n")
    assert _default_numbers(p) == {("mod", "A.__init__", "width", 32),
                                   ("mod", "A.__init__", "lo", -0.5),
                                   ("mod", "A.__init__", "alpha", 0.1),
                                   ("mod", "A.__init__.<lambda>", "w", 4),
                                   ("mod", "g", "c", 2)}


# Window lengths and counts written as whole numbers (issue 30 item 4): an integer n >= 2
# (or -n) is a window or a count when it is
# - a bound of a slice that is the whole subscript (``hist[-8:]``, ``ranked[:16]``): how
#   many of a sequence's items are read or kept;
# - an argument of a call, positional or keyword (``max(n // k, 2)``, ``np.empty(16)``,
#   ``deque(maxlen=8)``): a length or a count handed over;
# - n >= 3 multiplying or dividing (``4 * k``, ``idle / 8``): a window or a cadence
#   scaled from another (2 is a double or a half, as in FREE_NUMBERS; units as in
#   UNITS_AND_GUARDS);
# not when it is an index (``a[3]``, ``m[:, 4]``) or inside one (``x[len(x) // 4]``: an
# order statistic's position), a column slice of a multi-dimensional subscript
# (``v[:, :3]``: array layout), an element of a shape (``np.zeros((k, 4))``) or the
# digits of ``round`` (how a reported value is printed). Findings are (module, callee,
# ``[:]`` for a slice or the operator, value). Allowed, each for its reason:
WINDOW_NOT_THRESHOLDS = {
    ("alignment", "range", 4): "the header fields of an open collective (STEP, GROUP, OP, "
                               "BYTES): array layout",
    ("evidence", "_pooled", 4): "column 4 of the learned moments (block-mean variance): "
                                "array layout",
    ("telemetry", "_get", 2): "field 2 of a device's columns (rates): layout",
    ("telemetry", "_get", 3): "field 3 (last values): layout",
    ("telemetry", "_get", 4): "field 4 (clock-event reasons): layout",
    ("peers", "empty", 16): "the first capacity of a growing buffer (grown on demand: the "
                            "same values either way)",
    ("links", "max", 8): "the least capacity a table grows to (a buffer, the same values "
                         "either way)",
    ("ranks", "max", 8): "the least capacity a table grows to (a buffer, the same values "
                         "either way)",
    ("links", "[:]", 16): "groups listed in an incident's evidence (what the page shows)",
    ("p2p", "[:]", 16): "pairs listed in an incident's evidence (what the page shows)",
    ("rootcause", "[:]", 8): "Xid codes listed in a cause's evidence (what the page shows)",
    ("substep", "[:]", 2): "the two observations models.job reads (its obs[-1] and "
                           "obs[-2]): what is read, not a window",
    ("job", "[:]", 2): "the (step, ts) fields of an in-step observation: layout",
    ("p2p", "[:]", 2): "the costs each way (fields 0 and 1) of a pair's record: layout",
    ("actions", "*", 1000): "milliseconds: an action's version from its ts (a unit)",
    ("telemetry", "*", 5): "a device's five column slots (layout)",
}


def _window_numbers(path: Path) -> set[tuple[str, str, int]]:
    """(module, callee, ``[:]`` or operator, n) of each whole number >= 2 that is a
    slice's bound or a call's argument, or >= 3 that scales (the rule above)."""

    def whole(node: ast.AST | None) -> int | None:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return whole(node.operand)
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 2:
            return node.value
        return None

    tree = _parse(path)
    index = {id(n) for sub in ast.walk(tree) if isinstance(sub, ast.Subscript)
             for n in ast.walk(sub.slice)}
    scale = {ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//"}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and type(node.op) in scale:
            for op in (node.left, node.right):
                n = whole(op)
                if n is not None and n >= 3 and n not in UNITS_AND_GUARDS \
                        and id(op) not in index:
                    found.add((path.stem, scale[type(node.op)], n))
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            for bound in (node.slice.lower, node.slice.upper, node.slice.step):
                n = whole(bound)
                if n is not None:
                    found.add((path.stem, "[:]", n))
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else \
                getattr(node.func, "id", "")
            args = [*node.args, *(k.value for k in node.keywords)]
            if name == "round":
                args = args[:1]
            for arg in args:
                n = whole(arg)
                if n is not None:
                    found.add((path.stem, name, n))
    return found


def test_no_bare_window_length_or_count_in_models():
    found = _scanned(_window_numbers)
    new = sorted(found - set(WINDOW_NOT_THRESHOLDS))
    assert not new, ("window lengths or counts written as numbers in models/ (move them "
                     f"into the tree): {new}")


def test_the_window_scan_sees_slices_and_counts(tmp_path):
    p = tmp_path / "mod.py"
    p.write_text("def f(x, a, m, hist):\n"
                 "    r = sorted(hist[-5:])[len(hist) // 2] + m[:, :3].sum() + a[3]\n"
                 "    q = deque(maxlen=6), np.zeros((x, 4)), round(x, 3), a[1:], a[:n]\n"
                 "    v = a[(len(a) - 1) // 4] + 2 * x + x / 2 + 100 * x + 3 * x + x // 8\n"
                 "    return max(x // 4, 2) + m[:, 4] + f(x, -7)\n")
    assert _window_numbers(p) == {("mod", "[:]", 5), ("mod", "deque", 6), ("mod", "max", 2),
                                  ("mod", "f", 7), ("mod", "*", 3), ("mod", "//", 8),
                                  ("mod", "//", 4)}


def test_the_keys_that_replaced_defaults_and_windows_reach_the_models(tmp_path):
    """The keys that replaced numbers written as parameter defaults, window slices and
    counts land where those numbers were (a change of one changes what the models keep
    and test)."""
    from failslow.models.acting import ActingDetector
    from failslow.models.actions import ActionPlanner, MitigationConfig
    from failslow.models.job import JobState
    from failslow.models.p2p import P2PMonitor
    from failslow.models.substep import SubStep
    from failslow.simulator import SCENARIOS, simulate

    cfg = DetectionConfig.load(write(tmp_path, """
[rules.evidence]
width = 48
present_recent_min = 3
[rules.links]
pending_steps = 6
[rules.p2p]
pending_steps = 7
mid_steps = 3
recent_steps = 12
[rules.ranks]
jobwide_min = 5
[rules.substep]
min_ticks = 3
span_ratio = 3
[detector]
idle_sweeps = 4
[policy]
open_steps_max = 3
[mitigate]
hold_steps = 6
stale_s = 120.0
refine_gain = 0.3
forget_s = 60.0
effect_steps = 8
"""))
    jc = cfg.job_config()
    job = JobState("j", jc)
    assert job.evidence.peer.vals.shape[1] == job.evidence.own.vals.shape[1] == 48
    assert job.evidence.own.p.present_recent_min == 3 and jc.ranks.jobwide_min == 5
    assert job.aligner.max_age == job.comm.max_age == 6
    p2p = P2PMonitor(jc)
    assert (p2p.max_age, jc.p2p.mid_steps, jc.p2p.recent_steps) == (7, 3, 12)
    for c, want in ((jc, (3, 6, 9)), (DetectionConfig().job_config(), (2, 4, 8))):
        sub = SubStep(c)
        sub.window_s = 10.0             # sustain_s (2 s) is within one tick: min_ticks rules
        assert sub.scales() == want
    assert Detector(config=cfg).tracker.cfg("j").open_steps_max == 3
    assert Detector(config=cfg).config.detector.idle_sweeps == 4
    # the planner's steps are held hold_steps behind the newest step
    steps = [e for e in simulate(SCENARIOS["gpu_thermal_30"], seed=0).events()
             if e["kind"] == "step"][:16 * 12]
    det = ActingDetector(Detector(), ActionPlanner(MitigationConfig.from_mapping(cfg.mitigate)))
    assert det.process_batch(steps) == [] and det.stale_s == 120.0
    newest = max(e["step"] for e in steps)
    assert {e["step"] for e in det.held["job0"]} == set(range(newest - 5, newest + 1))
    # the planner keeps effect_steps of rank 0's steps and forgets a job silent forget_s
    mit = MitigationConfig.from_mapping(cfg.mitigate)
    assert mit.refine_gain == 0.3
    for c, kept, known in ((mit, 8, False), (MitigationConfig(), 20, True)):
        planner = ActionPlanner(c)
        for k in range(20):
            planner.observe({"job_id": "j", "rank": 0, "world_size": 2, "step": k,
                             "ts": float(k), "duration_s": 1.0})
        assert len(planner._step_s["j"]) == kept
        planner._prune(100.0)              # 81 s after the job's newest step
        assert ("j" in planner._newest) is known
