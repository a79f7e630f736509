"""Hand-written injection schedules (format documented in docs/schedules.md).

One injection per line, whitespace-separated::

    # kind          start  end    targets            intensity
    gpu_thermal     30s    90s    rank=5             30%
    slow_link       1m     +45s   rank=3,peer=11     2x
    cpu_contention  20     -      host=h1            0.5
    checkpoint      60     75     -                  -

>>> parse_schedule("gpu_thermal 30s 90s rank=5 30%")[0].intensity
0.3
"""

from __future__ import annotations

import os
from pathlib import Path

from failslow.simulator.spec import FaultSpec, SimulatorError

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_INT_KEYS = {"rank": "rank", "peer": "peer_rank", "peer_rank": "peer_rank", "nic": "nic"}


def _seconds(text: str, what: str) -> float:
    scale = _UNITS.get(text[-1:], None)
    body = text[:-1] if scale is not None else text
    try:
        value = float(body) * (scale or 1.0)
    except ValueError:
        raise SimulatorError(f"{what} {text!r} is not a time (e.g. 30, 30s, 2m, 1h)") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise SimulatorError(f"{what} {text!r} is not a finite time")
    return value


def _intensity(text: str) -> float:
    if text == "-":
        return 0.0
    try:
        if text.endswith("%"):
            return float(text[:-1]) / 100.0
        if text.endswith("x"):
            return float(text[:-1]) - 1.0  # 3x slower = 200 % more time
        return float(text)
    except ValueError:
        raise SimulatorError(f"intensity {text!r} is not a number (e.g. 0.3, 30%, 3x)") from None


def _targets(text: str) -> dict:
    out: dict = {}
    if text in ("-", "job", "*"):
        return out
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not value:
            raise SimulatorError(f"target {part!r} is not key=value "
                                 "(keys: rank, peer, host, nic, job)")
        if key in _INT_KEYS:
            if key == "nic" and value.startswith("mlx5_"):
                value = value[5:]
            try:
                out[_INT_KEYS[key]] = int(value)
            except ValueError:
                raise SimulatorError(f"target {key}={value!r} needs an integer") from None
        elif key in ("host", "job"):
            if key == "host" and not (value[:1] == "h" and value[1:].isdigit()):
                raise SimulatorError(f"host {value!r} is not a simulator host name (h0, h1, ...)")
            out[key] = value
        else:
            raise SimulatorError(f"unknown target key {key!r} (keys: rank, peer, host, nic, job)")
    return out


def parse_line(line: str) -> FaultSpec | None:
    """One schedule line -> FaultSpec (None for blank or comment lines)."""
    text = line.split("#", 1)[0].strip()
    if not text:
        return None
    fields = text.split()
    if len(fields) != 5:
        raise SimulatorError(f"expected 5 fields (kind start end targets intensity), "
                             f"got {len(fields)}")
    kind, start_t, end_t, target_t, intensity_t = fields
    start = _seconds(start_t, "start")
    if end_t == "-":
        end = None
    elif end_t.startswith("+"):
        end = start + _seconds(end_t[1:], "duration")
    else:
        end = _seconds(end_t, "end")
    spec = FaultSpec(kind=kind, start_s=start, end_s=end, intensity=_intensity(intensity_t),
                     **_targets(target_t))
    spec.check()
    return spec


def parse_schedule(text: str, source: str = "schedule") -> tuple[FaultSpec, ...]:
    """All injections of a schedule text; errors name ``source:line``."""
    specs = []
    for no, line in enumerate(text.splitlines(), start=1):
        try:
            spec = parse_line(line)
        except SimulatorError as exc:
            raise SimulatorError(f"{source}:{no}: {exc}") from None
        if spec is not None:
            specs.append(spec)
    return tuple(specs)


def load_schedule(path: str | os.PathLike) -> tuple[FaultSpec, ...]:
    """Read a schedule file (see docs/schedules.md) into FaultSpecs."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SimulatorError(f"cannot read schedule {str(p)!r}: {exc}") from None
    return parse_schedule(text, source=str(p))
