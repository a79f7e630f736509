"""`failslow detect`: input order (a bounded reorder window, several files) and input
with nothing valid in it."""

from __future__ import annotations

from collections import defaultdict

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failslow.cli import main
from failslow.commands import detect
from failslow.simulator import SCENARIOS, simulate


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


def _reference_order(events, window):
    """The ordering as first written, one key tuple per event: what ``ordered_chunks``
    must reproduce, errors included."""
    held: list[tuple] = []
    last = None
    full = window + max(window // 4, 1)
    for seq, ev in enumerate(events):
        rank = ev.get("rank")
        key = (ev["ts"], -1 if rank is None else rank, ev.get("host") or "", seq)
        if last is not None and key < last:
            raise detect.OutOfOrderError(f"at {seq}")
        held.append((key, ev))
        if len(held) >= full:
            held.sort(key=lambda item: item[0])
            last = held[len(held) - window - 1][0]
            yield from (ev for _, ev in held[:len(held) - window])
            del held[:len(held) - window]
    held.sort(key=lambda item: item[0])
    yield from (ev for _, ev in held)


def _order_or_error(make, events, window):
    out = []
    try:
        for ev in make(events, window):
            out.append(ev)
    except detect.OutOfOrderError:
        return out, True
    return out, False


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.sampled_from([None, 0, 1, 2]),
                          st.sampled_from(["h0", "h1", None])), max_size=120),
       st.integers(0, 12), st.integers(1, 9))
def test_chunked_ordering_is_the_per_event_ordering_with_its_errors(items, window, chunk):
    # many equal timestamps across ranks and hosts, some events far out of order: the
    # same events in the same order come out, and the error comes at the same event
    events = [{"kind": "step", "ts": float(t), "host": h, "i": i} | ({} if r is None
                                                                      else {"rank": r})
              for i, (t, r, h) in enumerate(items)]
    want, want_err = _order_or_error(_reference_order, events, window)

    def chunked(evs, window):
        chunks = [evs[i:i + chunk] for i in range(0, len(evs), chunk)]
        for part in detect.ordered_chunks(iter(chunks), window):
            yield from part
    got, got_err = _order_or_error(chunked, events, window)
    assert got_err == want_err
    assert [e["i"] for e in got] == [e["i"] for e in want]
