"""`failslow detect`: input order (a bounded reorder window, several files) and input
with nothing valid in it."""

from __future__ import annotations

from collections import defaultdict

import orjson
import pytest

from failslow.cli import main
from failslow.commands import detect
from simulator import SCENARIOS, simulate


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """A time-ordered trace and the same events as one file per rank (telemetry: per host)."""
    folder = tmp_path_factory.mktemp("order")
    path = folder / "sorted.jsonl"
    simulate(SCENARIOS["gpu_thermal_30"], seed=1).write_jsonl(path)
    parts: dict[str, list[bytes]] = defaultdict(list)
    for line in path.read_bytes().splitlines():
        ev = orjson.loads(line)
        who = f"rank{ev['rank']}" if ev.get("rank") is not None else f"host-{ev['host']}"
        parts[who].append(line + b"\n")
    files = []
    for who, lines in sorted(parts.items(), reverse=True):   # not the ts order of anything
        files.append(folder / f"{who}.jsonl")
        files[-1].write_bytes(b"".join(lines))
    cat = folder / "cat.jsonl"
    cat.write_bytes(b"".join(f.read_bytes() for f in files))
    return path, files, cat


def run(args: list[str], capsys) -> tuple[int, bytes, str]:
    rc = main(["detect", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out.encode(), out.err


def test_ranks_concatenated_give_the_sorted_traces_incidents(trace, capsys):
    path, files, cat = trace
    rc, sorted_out, _ = run([path], capsys)
    assert rc == 0 and sorted_out.count(b"\n") >= 2
    rc, cat_out, _ = run([cat], capsys)
    assert rc == 0 and cat_out == sorted_out


def test_one_file_per_rank_gives_the_sorted_traces_incidents(trace, capsys):
    path, files, _ = trace
    rc, sorted_out, _ = run([path], capsys)
    rc, files_out, err = run(files, capsys)
    assert rc == 0 and files_out == sorted_out
    assert f"{sum(len(f.read_bytes().splitlines()) for f in files)} events" in err


def test_input_out_of_order_beyond_the_window_is_a_one_line_error(trace, capsys, monkeypatch):
    _, _, cat = trace
    monkeypatch.setattr(detect, "REORDER_WINDOW", 1000)
    rc, _, err = run([cat], capsys)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "more than 1,000 events out of order" in lines[0]
    assert lines[0].startswith("failslow detect: event ts ")


def test_help_says_how_input_is_ordered(capsys):
    with pytest.raises(SystemExit):
        main(["detect", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "ts order within a window of 100,000 events" in text
    assert "further out of order is an error" in text


def test_empty_input_exits_non_zero_with_one_line(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    rc, out, err = run([empty], capsys)
    assert rc != 0 and out == b""
    assert err.strip().splitlines() == ["failslow detect: no valid event read (empty input); "
                                        "nothing to detect"]


def test_all_lines_invalid_exits_non_zero_with_a_summary(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{not json\n{"v":1,"kind":"step"}\n[1, 2]\n')
    rc, out, err = run([bad], capsys)
    assert rc != 0 and out == b""
    lines = err.strip().splitlines()
    assert lines[-1] == ("failslow detect: no valid event read (all 3 line(s) invalid); "
                         "nothing to detect")
    assert len(lines) == 4   # one warning per line, then the summary


def test_some_valid_lines_keep_going_and_count_the_skipped(trace, tmp_path, capsys):
    path, _, _ = trace
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(b"garbage\n" + path.read_bytes() + b"{}\n")
    rc, out, err = run([mixed], capsys)
    assert rc == 0 and out
    assert err.strip().splitlines()[-1].endswith("; 2 invalid line(s) skipped")
