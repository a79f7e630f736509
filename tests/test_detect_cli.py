"""`failslow detect FILE` end to end on simulator traces."""

from __future__ import annotations

import orjson
import pytest

from failslow import schema
from failslow.cli import main
from failslow.simulator import SCENARIOS, simulate


@pytest.fixture(scope="module")
def thermal(tmp_path_factory):
    path = tmp_path_factory.mktemp("detect") / "thermal.jsonl"
    simulate(SCENARIOS["gpu_thermal_30"], seed=1).write_jsonl(path)
    return path


def incidents(text: str) -> list[dict]:
    out = [orjson.loads(line) for line in text.splitlines() if line.strip()]
    for inc in out:
        schema.validate(inc)
    return out


def test_detect_finds_the_culprit_and_nothing_else(thermal, capsys):
    truth = orjson.loads(thermal.with_name(thermal.name + ".truth.json").read_bytes())
    fault = truth["faults"][0]
    assert main(["detect", str(thermal)]) == 0
    incs = incidents(capsys.readouterr().out)
    paged = {(i["fault"], i.get("rank")) for i in incs if i["severity"] != "info"}
    assert paged == {(fault["fault"], fault["rank"])}
    last = [i for i in incs if i.get("rank") == fault["rank"]][-1]
    assert last["root_cause"] == fault["root_cause"]
    first = next(i for i in incs if i.get("rank") == fault["rank"])
    assert fault["onset_ts"] <= first["detected_ts"] <= fault["onset_ts"] + 6 * truth["step_s"]


def test_detect_healthy_trace_has_no_incident(tmp_path, capsys):
    path = tmp_path / "healthy.jsonl"
    simulate(SCENARIOS["healthy_16"], seed=2).write_jsonl(path)
    assert main(["detect", str(path)]) == 0
    assert [i for i in incidents(capsys.readouterr().out) if i["severity"] != "info"] == []


def test_detect_skips_invalid_lines_with_a_warning(thermal, tmp_path, capsys):
    lines = thermal.read_bytes().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join(lines[:5] + [b"{not json", b'{"v":1,"kind":"step"}']
                               + lines[5:]) + b"\n")
    out = tmp_path / "incidents.jsonl"
    assert main(["detect", str(bad), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "line 6: value: not JSON" in captured.err or "line 6: not JSON" in captured.err
    assert "line 7: step.ts: required field is missing" in captured.err
    assert "2 invalid line(s) skipped" in captured.err
    assert incidents(out.read_text())


def test_detect_missing_file_is_one_line(tmp_path, capsys):
    assert main(["detect", str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("failslow detect: cannot read")


def test_detect_text_is_one_line_per_incident_when_who_why_cost(thermal, capsys):
    assert main(["detect", str(thermal)]) == 0
    events = incidents(capsys.readouterr().out)
    assert main(["detect", str(thermal), "--format", "text"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ids = list(dict.fromkeys(i["incident_id"] for i in events))
    assert len(lines) == len(ids) and len(events) > len(ids)     # updates folded into one
    truth = orjson.loads(thermal.with_name(thermal.name + ".truth.json").read_bytes())
    fault = truth["faults"][0]
    culprit = next(ln for ln in lines if f"rank {fault['rank']} (" in ln)
    last = [i for i in events if i.get("rank") == fault["rank"]][-1]
    worst = max(i["slowdown_pct"] for i in events if i["incident_id"] == last["incident_id"])
    assert culprit.startswith("20")                                          # when (UTC)
    assert f"rank {fault['rank']} ({last['host']} GPU {last['gpu']})" in culprit  # who
    assert f"{last['fault']}, cause {fault['root_cause']}" in culprit            # why
    assert f"{worst:.0f} % slower at worst" in culprit                          # cost
    assert f"{last['gpu_hours_lost']:.3g} GPU-h lost" in culprit
    assert culprit.endswith(f"[{last['incident_id']}]")
    assert ("resolved after" in culprit) == (last["status"] == "resolved")
    assert all(not ln.startswith("{") for ln in lines)


def test_detect_text_names_hosts_and_links(tmp_path, capsys):
    path = tmp_path / "link.jsonl"
    simulate(SCENARIOS["slow_link_host_50"], seed=1).write_jsonl(path)
    assert main(["detect", str(path), "--format", "text"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("host h1" in ln and "slow_link" in ln for ln in lines), lines


def test_detect_collects_no_garbage_while_it_runs_and_hands_the_collector_back(thermal):
    # issue 31: every chunk decoded and judged is frozen, so a collection mid-run walks
    # the job's state for nothing (184 young ones in a 131,072-rank job's judging): the
    # collector is off while events stream through, on again and nothing frozen after
    import gc

    from failslow.commands.detect import detect_lines
    from failslow.models.pipeline import Detector

    assert gc.isenabled()
    on: list[bool] = []
    with thermal.open("rb") as f:
        n = detect_lines(f, Detector(), lambda inc: on.append(gc.isenabled()),
                         lambda no, why: None)
    assert n[2] == len(on) > 0 and not any(on)
    assert gc.isenabled() and gc.get_freeze_count() == 0
