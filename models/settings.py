"""``DetectionConfig``: the one configuration tree of detection, with documented defaults.

Sections (TOML tables; docs/detection.md lists every key):

- ``[rules]``: the thresholds the rules share (``models.config.JobConfig``), with its
  sections ``[rules.evidence]`` (``EvidenceConfig``: the windowed tests) and
  ``[rules.links]`` (``LinkConfig``: collective groups, NIC counters);
- ``[policy]``: the paging policy (``models.policy.PolicyConfig``);
- ``[planner]``: the mitigation ladder (``models.mitigation.Planner``);
- ``[mitigate]``: closing the loop (``models.actions.MitigationConfig``), kept as given;
- ``[detector]``: the whole detector's settings (``models.config.DetectorConfig``:
  telemetry smoothing, when a job has ended), never per job;
- ``[[override]]``: per-job settings, ``jobs = "PATTERN"`` (fnmatch on the job id) plus
  any of the tables above; the first matching override wins, over the defaults.

An unknown key or a bad value raises ``DetectionConfigError`` with one line naming it.

>>> cfg = DetectionConfig.from_mapping({"policy": {"page_steps": 6},
...     "override": [{"jobs": "llm-*", "policy": {"page_steps": 3}}]})
>>> cfg.for_job("llm-70b").policy.page_steps, cfg.for_job("bert").policy.page_steps
(3, 6)
"""

from __future__ import annotations

import fnmatch
import inspect
import tomllib
from dataclasses import dataclass, field, fields, replace
from typing import Any

from failslow.models.config import SECTIONS as RULE_SECTIONS
from failslow.models.config import DetectorConfig, JobConfig
from failslow.models.mitigation import Planner
from failslow.models.policy import PolicyConfig
from failslow.schema.errors import FailslowError

SECTIONS = ("rules", "policy", "planner", "mitigate")


class DetectionConfigError(FailslowError):
    """A detection configuration file or table that cannot be used (one line)."""


def _params(cls: type) -> dict[str, Any]:
    """A plain class's constructor parameters and their defaults."""
    sig = inspect.signature(cls.__init__)     # type: ignore[misc]
    return {n: p.default for n, p in sig.parameters.items() if n != "self"}


def _typed(where: str, key: str, value: Any, default: Any) -> Any:
    """``value`` as the type of ``default`` (an int where an int is due, a number where a
    float is); DetectionConfigError otherwise."""
    if isinstance(default, tuple):      # a list of whole numbers (window lengths)
        ok = isinstance(value, list | tuple) and bool(value) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
        if not ok:
            raise DetectionConfigError(f"{where}.{key}: {value!r} is not a list of whole "
                                       "numbers >= 1")
        return tuple(value)
    if isinstance(default, bool) or default is None:
        ok = isinstance(value, bool) or default is None
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, type(default))
    if not ok:
        want = type(default).__name__ if default is not None else "value"
        raise DetectionConfigError(f"{where}.{key}: {value!r} is not a {want}")
    if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
        raise DetectionConfigError(f"{where}.{key}: {value!r} must be >= 0")
    return value


def _table(where: str, table: Any, known: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise DetectionConfigError(f"{where}: expected a table, got {table!r}")
    out = {}
    for key, value in table.items():
        if key not in known:
            raise DetectionConfigError(
                f"{where}: unknown key {key!r} (known: {', '.join(sorted(known))})")
        out[key] = _typed(where, key, value, known[key])
    return out


def _bounded(where: str, cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` of a section, each within its field's bounds (``below``: under it, a
    share of a step; ``most``: at most it, a smoothing weight; ``least``: at least it)."""
    for f in fields(cls):
        if f.name not in values:
            continue
        v, m = values[f.name], f.metadata
        if "below" in m and v >= m["below"]:
            raise DetectionConfigError(f"{where}.{f.name}: {v!r} must be < {m['below']:g}")
        if "most" in m and v > m["most"]:
            raise DetectionConfigError(f"{where}.{f.name}: {v!r} must be <= {m['most']:g}")
        if "least" in m and v < m["least"]:
            raise DetectionConfigError(f"{where}.{f.name}: {v!r} must be >= {m['least']:g}")
    return values


def _rules(where: str, table: Any, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` (a ``[rules]`` table as given so far) updated with ``table``: its keys
    are ``JobConfig``'s parameters, its sub-tables (``RULE_SECTIONS``) merge key by key."""
    if not isinstance(table, dict):
        raise DetectionConfigError(f"{where}: expected a table, got {table!r}")
    known = {k: v for k, v in _params(JobConfig).items() if k not in RULE_SECTIONS}
    out = dict(base)
    out.update(_table(where, {k: v for k, v in table.items() if k not in RULE_SECTIONS},
                      {**known, **dict.fromkeys(RULE_SECTIONS)}))
    for name, cls in RULE_SECTIONS.items():
        if name in table:
            sec = _bounded(f"{where}.{name}", cls, _table(
                f"{where}.{name}", table[name], {f.name: f.default for f in fields(cls)}))
            out[name] = {**base.get(name, {}), **sec}
    return out


@dataclass
class DetectionConfig:
    """Every threshold of detection: ``rules`` (``JobConfig`` keyword arguments),
    ``policy``, ``planner`` (``Planner`` keyword arguments), ``mitigate`` (the raw
    ``[mitigate]`` table, for ``models.actions.MitigationConfig``), ``detector``
    (``DetectorConfig``, the whole detector's) and per-job ``overrides`` (pattern,
    sections)."""

    rules: dict[str, Any] = field(default_factory=dict)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    planner: dict[str, Any] = field(default_factory=dict)
    mitigate: dict[str, Any] | None = None
    overrides: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    # a plain default (frozen): a DetectionConfig pickled before it existed reads it
    detector: DetectorConfig = DetectorConfig()

    def __post_init__(self) -> None:
        self._cache: dict[str, DetectionConfig] = {}

    # -- building -----------------------------------------------------------------------

    @classmethod
    def load(cls, path: str) -> DetectionConfig:
        """Read a TOML file; DetectionConfigError (one line) on any problem."""
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as e:
            raise DetectionConfigError(f"{path}: {e.strerror or e}") from None
        except tomllib.TOMLDecodeError as e:
            raise DetectionConfigError(f"{path}: not TOML: {e}") from None
        try:
            return cls.from_mapping(data)
        except DetectionConfigError as e:
            raise DetectionConfigError(f"{path}: {e}") from None

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> DetectionConfig:
        known = (*SECTIONS, "detector", "override")
        for key in data:
            if key not in known:
                raise DetectionConfigError(
                    f"unknown table {key!r} (known: {', '.join(known)})")
        base = cls()._with(data, "")
        base.detector = replace(base.detector, **_bounded("detector", DetectorConfig, _table(
            "detector", data.get("detector", {}),
            {f.name: f.default for f in fields(DetectorConfig)})))
        overs = data.get("override", [])
        if not isinstance(overs, list):
            raise DetectionConfigError("override: expected [[override]] tables")
        for i, o in enumerate(overs):
            where = f"override[{i}]"
            if not isinstance(o, dict) or not isinstance(o.get("jobs"), str):
                raise DetectionConfigError(f"{where}: needs jobs = \"PATTERN\"")
            for key in o:
                if key == "detector":
                    raise DetectionConfigError(
                        f"{where}: [detector] is the whole detector's, not per job")
                if key not in (*SECTIONS, "jobs"):
                    raise DetectionConfigError(f"{where}: unknown key {key!r}")
            base._with(o, where + ".")       # checked now, applied per job
            base.overrides.append((o["jobs"], {k: v for k, v in o.items() if k != "jobs"}))
        return base

    def _with(self, data: dict[str, Any], prefix: str) -> DetectionConfig:
        rules = _rules(prefix + "rules", data.get("rules", {}), self.rules)
        planner = dict(self.planner)
        planner.update(_table(prefix + "planner", data.get("planner", {}), _params(Planner)))
        pol_known = {f.name: f.default for f in fields(PolicyConfig)}
        policy = replace(self.policy, **_table(prefix + "policy", data.get("policy", {}),
                                                pol_known))
        try:
            policy.check()
        except ValueError as e:
            raise DetectionConfigError(f"{prefix}{e}") from None
        mitigate = self.mitigate
        if "mitigate" in data:
            mitigate = {**(mitigate or {}), **data["mitigate"]}
            _check_mitigate(mitigate, prefix)
        return DetectionConfig(rules, policy, planner, mitigate, list(self.overrides),
                               self.detector)

    # -- reading ------------------------------------------------------------------------

    def for_job(self, job_id: str) -> DetectionConfig:
        """The settings of one job: the defaults, then the first override matching it."""
        got = self._cache.get(job_id)
        if got is None:
            got = self
            for pattern, tables in self.overrides:
                if fnmatch.fnmatchcase(job_id, pattern):
                    got = self._with(tables, "")
                    break
            if len(self._cache) < 4096:
                self._cache[job_id] = got
        return got

    def policy_of(self, job_id: str) -> PolicyConfig:
        return self.for_job(job_id).policy

    def job_config(self) -> JobConfig:
        plain = {k: v for k, v in self.rules.items() if k not in RULE_SECTIONS}
        return JobConfig(**plain, **{name: cls(**self.rules.get(name, {}))
                                     for name, cls in RULE_SECTIONS.items()})

    def make_planner(self) -> Planner:
        return Planner(**self.planner)

    def describe(self) -> dict[str, Any]:
        """Every setting with its value (defaults filled in): what docs/detection.md lists."""
        plain = {k: v for k, v in self.rules.items() if k not in RULE_SECTIONS}
        rules: dict[str, Any] = {k: v for k, v in _params(JobConfig).items()
                                 if k not in RULE_SECTIONS}
        rules.update(plain)
        for name, cls in RULE_SECTIONS.items():
            rules[name] = {**{f.name: f.default for f in fields(cls)},
                           **self.rules.get(name, {})}
        return {"rules": rules,
                "policy": {f.name: getattr(self.policy, f.name) for f in fields(PolicyConfig)},
                "planner": {**_params(Planner), **self.planner},
                "detector": {f.name: getattr(self.detector, f.name)
                             for f in fields(DetectorConfig)},
                "mitigate": self.mitigate}


def reference_markdown() -> str:
    """docs/detection.md's reference of the sections of ``[rules]`` and of
    ``[detector]``: one table per section, every key with its default and what it
    decides (``tests/test_models_settings.py`` checks the docs hold this text)."""
    from failslow.models.config import section_docs

    out = []
    tables = [(f"[rules.{n}]", c) for n, c in RULE_SECTIONS.items()]
    tables.append(("[detector]", DetectorConfig))
    for title, cls in tables:
        out.append(f"`{title}` (`{cls.__name__}`, models/config.py):\n")
        out.append("| key | default | what it decides |\n|---|---|---|")
        for key, default, doc in section_docs(cls):
            shown = list(default) if isinstance(default, tuple) else \
                round(default, 6) if isinstance(default, float) else default
            out.append(f"| `{key}` | {shown} | {doc} |")
        out.append("")
    return "\n".join(out)


def _check_mitigate(table: dict[str, Any], prefix: str) -> None:
    try:
        from failslow.models.actions import MitigationConfig
    except ImportError:        # the mitigation loop is not built: the table is kept as is
        return
    try:
        MitigationConfig.from_mapping(dict(table))
    except FailslowError as e:
        raise DetectionConfigError(f"{prefix}{e}") from None

