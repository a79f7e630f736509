"""`failslow report`: a simulated job with its incidents in chdb, rendered as one
self-contained HTML page (incident and job views), through the library and the command
line, and looked at in a real browser (Chromium headless takes a screenshot)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from png_support import colors, decode
from report_support import load_job
from storage_support import ch  # noqa: F401 - fixture

import failslow.storage.report.svg as svg
from failslow.simulator import SCENARIOS, simulate
from failslow.storage.report import ReportError, incident_page, job_page
from failslow.storage.report.data import SMALL_JOB

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
CULPRIT_RGB = (214, 39, 40)


@pytest.fixture
def thermal(ch):  # noqa: F811
    """gpu_thermal_30: 16 ranks, rank 5 throttles 30 % (one incident, several updates)."""
    incidents = load_job(ch, "gpu_thermal_30")
    assert {i["rank"] for i in incidents} == {5}
    return ch, incidents


def _self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    lowered = page.lower()
    for needle in ("<script", "<link", " src=", "href=", "url(", "@import"):
        assert needle not in lowered, f"the page would fetch something: {needle}"
    # the only URL is the SVG namespace, which is never fetched
    assert set(re.findall(r"https?://[^\"' ]+", page)) <= {"http://www.w3.org/2000/svg"}


def test_incident_page_shows_culprit_timeline_telemetry_and_cost(thermal):
    client, incidents = thermal
    inc_id = incidents[0]["incident_id"]
    page = incident_page(client, inc_id)
    _self_contained(page)
    assert "rank 5" in page and "gpu_thermal" in page and inc_id in page
    # why it pages (issue 30): the rule that confirmed it and the policy's reason
    loud = [i for i in incidents if i["severity"] != "info"][-1]["evidence"]
    assert f"why: rule <b>{loud['rule']}</b>" in page and "-&gt; " in page
    # every incident row is in the timeline table, in order, the last one resolved
    rows = re.findall(r"<tr><td>(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)</td>", page)
    assert len(rows) == len(incidents) == len({i["ts"] for i in incidents})
    assert rows == sorted(rows)
    assert incidents[-1]["status"] == "resolved" and ">resolved<" in page
    worst = max(i["slowdown_pct"] for i in incidents)
    assert f"{worst:.1f} %" in page
    # step times (16 ranks: a line per rank), timeline (and the cost over time when the
    # incidents carry it), 3 GPU + 2 NIC telemetry charts
    priced = any(i.get("gpu_hours_lost") is not None for i in incidents)
    assert page.count("<svg") == 7 + priced
    assert ("GPU-hours the job lost to the culprit so far" in page) == priced
    steps_svg = page[page.index("<svg"):page.index("</svg>")]
    assert steps_svg.count("<polyline") == 16 + 1       # every rank + the job's step time
    assert "rank 5" in steps_svg and "onset" in steps_svg and "resolved" in steps_svg
    for title in ("SM clock: h0 GPU 5 vs peers", "GPU temperature", "GPU power",
                  "NIC throughput", "NIC pause + CNP"):
        assert title in page
    # GPU-hours lost: shown when the incidents table has the column
    cols = client.query("SELECT name FROM system.columns WHERE database = {d:String} AND "
                        "table = 'incidents'", {"d": client.database})[1]
    assert ("GPU-hours lost" in page) == (("gpu_hours_lost",) in cols)


def test_job_page_lists_incidents_and_step_times(thermal):
    client, incidents = thermal
    page = job_page(client, "job0")
    _self_contained(page)
    assert incidents[0]["incident_id"] in page and "Job job0" in page
    assert ">16<" in page                                # ranks card
    assert page.count("<svg") == 1 and "rank 5" in page


def test_unknown_incident_or_job_is_a_one_line_error(thermal):
    client, _ = thermal
    with pytest.raises(ReportError, match="no incident 'nope'") as err:
        incident_page(client, "nope")
    assert "\n" not in str(err.value)
    with pytest.raises(ReportError, match="no steps of job 'nojob'"):
        job_page(client, "nojob")


def test_a_large_job_draws_peers_as_a_band_not_one_line_per_rank(ch):  # noqa: F811
    incidents = load_job(ch, "pipeline_stage_slow", steps=50)      # 64 ranks, rank 20 slow
    world = ch.query(f"SELECT max(world_size) FROM {ch.database}.steps")[1][0][0]
    assert world > SMALL_JOB
    culprits = [i for i in incidents if i["rank"] is not None]
    assert culprits
    page = incident_page(ch, culprits[0]["incident_id"])
    steps_svg = page[page.index("<svg"):page.index("</svg>")]
    assert "peers p10-p90" in steps_svg and "<polygon" in steps_svg
    assert steps_svg.count("<polyline") <= 4          # median, culprit, peer rank, step time
    assert f"rank {culprits[0]['rank']}" in steps_svg


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium here: `apt-get install chromium` (Debian; `make test` does it "
                "as root) to look at the page in a real browser")


def _screenshot(html: Path, tmp_path: Path, height: int = 1400) -> np.ndarray:
    """The page as headless Chromium renders it, 1000 px wide, offline."""
    browser = _chromium()
    shot = html.with_suffix(".png")
    # no network: --proxy-server to nowhere makes any fetch fail
    out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                          "--disable-quic", "--no-first-run", "--disable-background-networking",
                          "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                          f"--user-data-dir={tmp_path / 'chromium'}",
                          "--proxy-server=127.0.0.1:9", f"--screenshot={shot}",
                          f"--window-size=1000,{height}", html.as_uri()],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HOME": str(tmp_path)})
    if not shot.exists():
        pytest.skip(f"Chromium could not run here (exit {out.returncode}): "
                    f"{out.stderr.strip().splitlines()[-1:] or ''}")
    image = decode(shot.read_bytes())
    assert image.shape[:2] == (height, 1000)
    return image


def _drawn(image: np.ndarray) -> None:
    """Not a blank page, and the culprit's red line is on it."""
    assert colors(image) > 200                      # text, charts, bands: not a blank page
    ink = (image[..., :3] < 200).any(axis=2)
    assert ink.any(axis=1).mean() > 0.3              # something drawn on many rows
    rgb = image[..., :3].astype(int)
    red = (np.abs(rgb - CULPRIT_RGB) < 30).all(axis=2)
    assert red.sum() > 500                           # the culprit's line is drawn


def _charts_have_data_and_room(page: str) -> list[str]:
    """Every chart draws data; no y tick label reaches the rotated axis label. The charts."""
    charts = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert charts
    for chart in charts:
        title = re.search(r"<title>(.*?)</title>", chart).group(1)
        assert "no data in this range" not in chart, title
        assert "<polyline" in chart or "<polygon" in chart, title
        label_x = float(re.search(r"translate\(([\d.]+) ", chart).group(1))
        for x, text in re.findall(r'<text x="([\d.]+)" y="[\d.]+" text-anchor="end" '
                                  r'class="tk">([^<]*)</text>', chart):
            assert float(x) - svg.CHAR_W * len(text) > label_x + 7, (title, text)
    return charts


def test_the_page_in_a_real_browser(thermal, tmp_path):
    client, incidents = thermal
    html = tmp_path / "incident.html"
    page = incident_page(client, incidents[0]["incident_id"])
    _charts_have_data_and_room(page)
    html.write_text(page, encoding="utf-8")
    _drawn(_screenshot(html, tmp_path))


def _cpu_trace(folder: Path) -> list[Path]:
    """gpu_thermal_30 as a CPU job's hook writes it: steps and collectives, no GPU or NIC
    samples, one file per half of the ranks."""
    files = [folder / "even.jsonl", folder / "odd.jsonl"]
    with files[0].open("wb") as even, files[1].open("wb") as odd:
        for ev in simulate(SCENARIOS["gpu_thermal_30"], seed=0).events():
            if ev["kind"] in ("gpu", "nic", "host"):
                continue
            ev.pop("gpu", None)
            (odd if ev.get("rank", 0) % 2 else even).write(orjson.dumps(ev) + b"\n")
    return files


def _report(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "failslow.cli", "report", *args],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def test_report_from_trace_files_of_a_cpu_job_in_a_real_browser(tmp_path):
    files = [str(f) for f in _cpu_trace(tmp_path)]
    job = _report("--trace", *files, cwd=tmp_path)          # the trace's one job
    assert job.returncode == 0, job.stderr
    page = (tmp_path / "failslow-report-job-job0.html").read_text()
    _self_contained(page)
    assert "Job job0" in page and "job0:slow_rank:r5:" in page
    assert "seconds since the first step" in page           # a 2-minute job, not 0.01 min
    _charts_have_data_and_room(page)

    inc_id = re.search(r"job0:slow_rank:r5:\d+", page).group(0)
    inc = _report(inc_id, "--trace", *files, "--out", "inc.html", cwd=tmp_path)
    assert inc.returncode == 0, inc.stderr
    page = (tmp_path / "inc.html").read_text()
    _self_contained(page)
    charts = _charts_have_data_and_room(page)
    # steps, slowdown and cost timelines; no GPU or NIC chart without samples, one line
    assert len(charts) == 3, [re.search(r"<title>(.*?)</title>", c).group(1) for c in charts]
    assert "No samples of SM clock, GPU temperature, GPU power, NIC throughput" in page
    assert "GPU -" not in page
    _drawn(_screenshot(tmp_path / "inc.html", tmp_path))


def test_report_from_traces_asks_which_job_and_names_a_missing_file(tmp_path):
    trace = tmp_path / "two.jsonl"
    trace.write_bytes(b"".join(orjson.dumps(
        {"v": 1, "kind": "step", "ts": 1.7e9 + s, "job_id": job, "rank": 0, "world_size": 1,
         "host": "h0", "step": s, "duration_s": 1.0}) + b"\n"
        for s in range(3) for job in ("a", "b")))
    out = _report("--trace", str(trace), cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "failslow report: the traces hold 2 jobs (a, b): give --job JOB or an INCIDENT_ID")
    out = _report("--trace", str(trace), "a:slow_rank:r0:1", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "failslow report: cannot read a:slow_rank:r0:1: No such file or directory; an "
        "INCIDENT_ID goes before --trace"]


def test_cli_report_writes_a_page_and_rejects_unknown_ids(tmp_path):
    folder = tmp_path / "chdb"
    loaded = subprocess.run([sys.executable, str(ROOT / "tests" / "report_support.py"),
                             str(folder), "gpu_thermal_30"], capture_output=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr.decode()[-2000:]
    inc_id = orjson.loads(loaded.stdout.splitlines()[0])["incident_id"]

    def fs(*args):
        return subprocess.run([sys.executable, "-m", "failslow.cli", "report",
                               "--clickhouse", f"chdb://{folder}", *args], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)

    out = fs(inc_id, "--out", str(tmp_path / "i.html"))
    assert out.returncode == 0, out.stderr
    assert inc_id in (tmp_path / "i.html").read_text()
    out = fs("--job", "job0")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "failslow-report-job-job0.html").exists()
    for args, reason in ((["nope"], "no incident 'nope'"), (["--job", "nojob"], "no steps of job"),
                         ([], "give one INCIDENT_ID or --job JOB (or --trace FILE...)")):
        out = fs(*args)
        assert out.returncode == 2 and reason in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
