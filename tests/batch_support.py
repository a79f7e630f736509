"""Helpers of the batched-input tests: what a reader of the telemetry store sees, and
`failslow detect`'s path over lines (incidents, the detector, the warnings)."""

from __future__ import annotations

import orjson

from failslow.commands.detect import detect_lines
from failslow.models.pipeline import Detector
from failslow.models.telemetry import TelemetryStore


def store_state(st: TelemetryStore) -> dict:
    """Everything a reader of the store can see, per device."""
    out: dict = {"gpu_rank": dict(st.gpu_rank)}
    for key, d in st.gpus.items():
        out[("gpu", key)] = (d.gauges, d.first, d.rates, d.last, d.reasons, list(d.xids),
                             d.last_ts, d.n, d.down)
    for key, d in st.nics.items():
        out[("nic", key)] = (d.gauges, d.first, d.rates, d.last, d.down, d.last_ts, d.n)
    for key, d in st.hosts.items():
        out[("host", key)] = (d.gauges, d.first, d.last_ts, d.n)
    return out


def detect_all(lines: list[bytes]) -> tuple[bytes, Detector, list]:
    """The incidents (one JSON line each), the detector and the (line, why) warnings of
    `failslow detect` over ``lines``."""
    det = Detector()
    out: list[bytes] = []
    warned: list = []
    detect_lines(iter(lines), det, lambda inc: out.append(orjson.dumps(
        inc, option=orjson.OPT_SERIALIZE_NUMPY)), lambda no, why: warned.append((no, why)))
    return b"\n".join(out), det, warned
