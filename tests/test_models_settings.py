"""One configuration tree (``models.settings.DetectionConfig``): TOML files, per-job
overrides, one-line errors, and no threshold outside it."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
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
    "pipeline": {"TELEMETRY_QUEUE_CAP"},   # memory bound of the telemetry queue
    # a step event's fields read per rank and the value of one that is absent (wire format)
    "job": {"_GATHER"},
}


def _module_numbers(path: Path) -> set[str]:
    """Upper-case module-level names assigned an expression holding a number (also
    ``A, B = 1, 2``)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
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


def test_no_module_threshold_in_models():
    found = set()
    for path in sorted((ROOT / "models").glob("*.py")):
        if path.stem in ("settings", "policy", "config", "actions"):
            continue
        allowed = NOT_THRESHOLDS.get(path.stem, set())
        found |= {f"{path.stem}.{n}" for n in _module_numbers(path) - allowed}
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
    for node in ast.walk(ast.parse(path.read_text())):
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
    found: set[tuple[str, float]] = set()
    for path in sorted((ROOT / "models").glob("*.py")):
        if path.stem in ("settings", "policy", "config", "actions"):
            continue
        found |= _compared_numbers(path)
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
    tree = ast.parse(path.read_text())
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
    found: set[tuple[str, float]] = set()
    for path in sorted((ROOT / "models").glob("*.py")):
        if path.stem in ("settings", "policy", "config", "actions"):
            continue
        found |= _argument_numbers(path)
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
