"""One self-contained HTML page per incident or per job: inline CSS and SVG, no script,
nothing fetched when it is opened (it can be mailed, attached to a ticket, opened offline).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from html import escape
from typing import Any

import numpy as np

import failslow.storage.report.svg as svg  # the module, not the package: no import circle
from failslow.storage.client import Client
from failslow.storage.report.data import (
    AFTER_S,
    BEFORE_S,
    MAX_WINDOW_S,
    SMALL_JOB,
    Reader,
    ReportError,
    Series,
    Steps,
)

CULPRIT = "#d62728"
OTHERS = ["#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
PEERS = "#4c72b0"
WRAP = {"incident", "onset (UTC)", "resolved (UTC)"}   # columns that may wrap (long ids, dates)

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;
max-width:900px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.sub{color:#666}.cards{display:flex;flex-wrap:wrap;gap:10px;margin:14px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:120px}
.card b{display:block;font-size:20px}.card span{color:#666;font-size:12px}
.sev-critical{color:#b00}.sev-warning{color:#b60}.sev-info{color:#666}
.tw{overflow-x:auto}table{border-collapse:collapse;width:100%;font-size:12.5px}
th,td{border-bottom:1px solid #eee;padding:3px 5px;text-align:left;white-space:nowrap}
th{white-space:normal}td.id{white-space:normal;overflow-wrap:anywhere}
th{background:#f6f6f6}td.num{text-align:right}
svg.chart{display:block;margin:6px 0 14px;max-width:100%;height:auto}
.chart text{font:11px system-ui,Helvetica,Arial,sans-serif;fill:#333}
.chart .ct{font-weight:600;font-size:12.5px}.chart .tk{fill:#666}.chart .nd{fill:#999}
.chart .pa{fill:#fbfbfb;stroke:#ccc}.chart .gr{stroke:#e8e8e8}
pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}
footer{margin-top:30px;color:#888;font-size:12px}
"""


def _utc(ts: float | None) -> str:
    if ts is None or not np.isfinite(ts):
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _num(v: Any, fmt: str = "{:.1f}") -> str:
    return "-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else fmt.format(v)


def _duration(seconds: float) -> str:
    s = int(max(0.0, seconds))
    return f"{s // 3600} h {s % 3600 // 60:02d} min" if s >= 3600 else f"{s // 60} min {s % 60:02d} s"


def _page(title: str, body: list[str]) -> str:
    made = _utc(time.time())
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            + "".join(body)
            + f"<footer>failslow report, generated {made} UTC. All times UTC.</footer>"
              "</body></html>")


def _cards(items: list[tuple[str, str, str]]) -> str:
    return "<div class=\"cards\">" + "".join(
        f"<div class=\"card\"><b class=\"{cls}\">{escape(value)}</b><span>{escape(label)}"
        "</span></div>" for value, label, cls in items) + "</div>"


def _table(columns: list[str], rows: list[list[str]], numeric: frozenset[str] | set[str] = frozenset()) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(
        f"<td{' class=num' if c in numeric else ' class=id' if c in WRAP else ''}>"
        f"{escape(v)}</td>"
        for c, v in zip(columns, r, strict=True)) + "</tr>" for r in rows)
    return f"<div class=tw><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


def _step_chart(steps: Steps, ref: float, highlight: dict[int, str], markers: list[svg.Marker],
                x_label: str, scale: float = 1.0) -> str:
    chart = svg.Chart(f"Own work per rank: step time minus time blocked in collectives "
                      f"({steps.world} ranks)", x_label, "seconds per step", markers=markers)
    rel = (steps.t - ref) / scale
    chart.y_max = _robust_max(steps)
    if steps.every and steps.world <= SMALL_JOB:
        for rank, (t, d) in sorted(steps.every.items()):
            if rank not in highlight:
                chart.lines.append(svg.Line((t - ref) / scale, d, "other ranks", "#b8b8b8", 1.0,
                                            legend=False))
        if chart.lines:
            chart.lines[0].legend = True
    else:
        chart.bands.append(svg.Band(rel, steps.p10, steps.p90, "peers p10-p90", "#a9c1de"))
        chart.lines.append(svg.Line(rel, steps.p50, "peers median", PEERS, 1.5))
    for rank, color in highlight.items():
        if rank in steps.ranks:
            t, d = steps.ranks[rank]
            chart.lines.append(svg.Line((t - ref) / scale, d, f"rank {rank}", color, 2.2))
    chart.lines.append(svg.Line(rel, steps.step_s, "job step time", "#333", 1.2, "5 3"))
    return svg.render(chart, height=280)


def _robust_max(steps: Steps) -> float | None:
    """Upper end of the y axis: a little above the 99th percentile of what is drawn,
    leaving out each line's first 5 points: a job's first steps (warm-up) take several
    times longer and would flatten a 20 % slowdown to a line. Higher values are clipped."""
    values = [steps.step_s, steps.p90, *(d for _, d in steps.ranks.values())]
    flat = np.concatenate([v[5:][np.isfinite(v[5:])] for v in values if v.size > 5] or
                          [np.array([])])
    return float(np.quantile(flat, 0.99)) * 1.15 if flat.size else None


def _series_chart(s: Series, ref: float, who: str, markers: list[svg.Marker]) -> str:
    chart = svg.Chart(f"{s.name}: {who} vs peers", "seconds from onset", s.unit, markers=markers)
    chart.bands.append(svg.Band(s.t - ref, s.p10, s.p90, "peers p10-p90", "#a9c1de"))
    chart.lines.append(svg.Line(s.t - ref, s.p50, "peers median", PEERS, 1.5))
    chart.lines.append(svg.Line(s.mine_t - ref, s.mine, who, CULPRIT, 2.2))
    return svg.render(chart)


def _incident_markers(inc: dict[str, Any], ref: float, scale: float = 1.0) -> list[svg.Marker]:
    out = [svg.Marker((inc["onset_ts"] - ref) / scale, "onset", "#444"),
           svg.Marker((inc["detected_ts"] - ref) / scale, "detected", "#b60")]
    if inc.get("resolved_ts") is not None:
        out.append(svg.Marker((inc["resolved_ts"] - ref) / scale, "resolved", "#2a2"))
    return out


def _acted(rows: list[dict], key: str = "action") -> str | None:
    """The newest ``evidence.<key>`` of the incident's rows (JSON text in ClickHouse)."""
    for row in reversed(rows):
        evidence = row.get("evidence")
        if isinstance(evidence, str):
            try:
                evidence = json.loads(evidence) if evidence else None
            except ValueError:
                evidence = None
        if isinstance(evidence, dict) and evidence.get(key):
            return str(evidence[key])
    return None


def incident_page(client: Client, incident_id: str) -> str:
    """The page of one incident: summary and cost, timeline, step times, telemetry."""
    reader = Reader(client)
    rows = reader.incident_rows(incident_id)
    last = rows[-1]
    onset = float(last["onset_ts"])
    end = float(last["resolved_ts"] or last["ts"])
    t0, t1 = onset - BEFORE_S, min(end + AFTER_S, onset + MAX_WINDOW_S)
    job, rank, host = last["job_id"], last["rank"], last["host"]
    culprit = (f"rank {rank}" if rank is not None else f"host {host}") + (
        f" <-> rank {last['peer_rank']}" if last.get("peer_rank") is not None else "")
    body = [f"<h1>{escape(last['fault'])} in job {escape(job)}: {escape(culprit)}</h1>",
            f"<div class=\"sub\">incident {escape(incident_id)} &middot; host "
            f"{escape(str(host or '-'))}"
            + (f", GPU {escape(str(last['gpu']))}" if last["gpu"] is not None else "")
            + f" &middot; root cause <b>{escape(str(last['root_cause'] or 'unknown'))}</b> "
            f"&middot; mitigation <b>{escape(str(last['mitigation'] or '-'))}</b></div>"]
    rule, policy = _acted(rows, "rule"), _acted(rows, "policy")
    if rule or policy:  # issue 30: why it pages (CONTRACT.md evidence.rule / policy)
        body.append(f"<div class=\"sub\">why: rule <b>{escape(rule or '-')}</b> &middot; "
                    f"{escape(policy or '-')}</div>")
    done = _acted(rows)
    if done:  # issue 32: what failslow did about it, and its measured effect
        body.append(f"<div class=\"sub\">done: <b>{escape(done)}</b></div>")
    duration = end - onset
    cards = [(last["status"], "status", ""),
             (last["severity"], "severity", f"sev-{last['severity']}"),
             (f"{last['slowdown_pct']:.1f} %", "job slowdown now", ""),
             (f"{max(r['slowdown_pct'] for r in rows):.1f} %", "worst slowdown", ""),
             (_duration(duration), "resolved after onset" if last["status"] == "resolved"
              else "last update after onset", "")]
    if "gpu_hours_lost" in last:
        cards.append((_num(last["gpu_hours_lost"], "{:.3g}").replace("-", "n/a"),
                      "GPU-hours lost", ""))
    body.append(_cards(cards))

    ranks = [r for r in (rank, last.get("peer_rank")) if r is not None]
    if rank is None and host:
        ranks = _ranks_of_host(reader, job, host, t0, t1)
    steps = reader.steps(job, t0, t1, ranks)
    colors = {r: (CULPRIT if i == 0 else OTHERS[(i - 1) % len(OTHERS)])
              for i, r in enumerate(ranks[:6])}
    markers = _incident_markers(last, onset)
    body.append("<h2>Step times around the onset</h2>")
    body.append(_step_chart(steps, onset, colors, markers, "seconds from onset"))

    body.append("<h2>Timeline</h2>")
    body.append(_timeline_chart(rows, onset))
    cols = ["time (UTC)", "+s", "status", "severity", "slowdown %", "root cause", "mitigation"]
    if "gpu_hours_lost" in last:
        cols.append("GPU-h lost")
    trows = []
    for r in rows:
        row = [_utc(r["ts"]), f"{r['ts'] - onset:.0f}", r["status"], r["severity"],
               f"{r['slowdown_pct']:.1f}", str(r["root_cause"] or "-"), str(r["mitigation"] or "-")]
        if "gpu_hours_lost" in r:
            row.append(_num(r["gpu_hours_lost"], "{:.3g}"))
        trows.append(row)
    body.append(_table(cols, trows, {"+s", "slowdown %", "GPU-h lost"}))
    body.append(f"<p class=\"sub\">onset {_utc(onset)} &middot; detected "
                f"{_utc(last['detected_ts'])} &middot; resolved {_utc(last['resolved_ts'])}</p>")

    body.append("<h2>Device telemetry</h2>")
    body.extend(_telemetry(reader, last, job, t0, t1, markers))
    if last.get("evidence") and last["evidence"] not in ("", "{}"):
        body.append("<h2>Evidence</h2><pre>" + escape(str(last["evidence"])[:4000]) + "</pre>")
    return _page(f"failslow: {incident_id}", body)


def _ranks_of_host(reader: Reader, job: str, host: str, t0: float, t1: float) -> list[int]:
    t = reader._q("SELECT DISTINCT rank FROM {db}.steps WHERE job_id = {j:String} AND "
                  "host = {h:String} AND ts BETWEEN toDateTime64({a:Float64}, 3) AND "
                  "toDateTime64({b:Float64}, 3) ORDER BY rank LIMIT 8", j=job, h=host, a=t0, b=t1)
    return [int(r[0]) for r in t.rows]


def _telemetry(reader: Reader, inc: dict[str, Any], job: str, t0: float, t1: float,
               markers: list[svg.Marker]) -> list[str]:
    host, gpu = inc["host"], inc["gpu"]
    if inc["rank"] is not None and (host is None or gpu is None):
        found = reader.gpu_of(job, int(inc["rank"]))
        if found:
            host, gpu = found
    if not host:
        return ["<p class=\"sub\">The incident names no host: no device telemetry to show.</p>"]
    hosts = reader.job_hosts(job, t0, t1) or [host]
    who = f"{host} GPU {gpu}" if gpu is not None else f"{host} (all GPUs)"
    onset = float(inc["onset_ts"])
    # A measure nobody sampled (a CPU job, a host with no `failslow collect`) gets no
    # empty chart, only its name in one line.
    charts, missing = [], []
    for series, name in [*((s, who) for s in reader.gpu_series(hosts, host, gpu, t0, t1)),
                         *((s, host) for s in reader.nic_series(hosts, host, t0, t1))]:
        if _has_data(series):
            charts.append(_series_chart(series, onset, name, markers))
        else:
            missing.append(series.name)
    out = [f"<p class=\"sub\">{escape(who)} against the {len(hosts)} host(s) of job "
           f"{escape(job)}.</p>"] if charts else []
    out += charts
    if missing:
        out.append(f"<p class=\"sub\">No samples of {escape(', '.join(missing))} for "
                   f"{escape(host)} or its peers in this window (a CPU job, or no `failslow "
                   "collect` on the hosts).</p>")
    return out


def _has_data(s: Series) -> bool:
    return bool(np.isfinite(s.mine).any() or np.isfinite(s.p50).any())


def _timeline_chart(rows: list[dict[str, Any]], ref: float) -> str:
    t = np.array([r["ts"] - ref for r in rows], dtype=float)
    pct = np.array([r["slowdown_pct"] for r in rows], dtype=float)
    chart = svg.Chart("Job slowdown attributed to the culprit, per incident update",
                      "seconds from onset", "slowdown (%)", step=True,
                      markers=_incident_markers(rows[-1], ref))
    chart.lines.append(svg.Line(t, pct, "slowdown %", CULPRIT, 2.0, dots=True))
    out = svg.render(chart, height=200)
    if "gpu_hours_lost" in rows[-1]:
        lost = np.array([np.nan if r["gpu_hours_lost"] is None else r["gpu_hours_lost"]
                         for r in rows], dtype=float)
        if np.isfinite(lost).any():
            cost = svg.Chart("GPU-hours the job lost to the culprit so far", "seconds from onset",
                             "GPU-hours", step=True, markers=_incident_markers(rows[-1], ref))
            cost.lines.append(svg.Line(t, lost, "GPU-hours lost", "#555", 2.0, dots=True))
            out += svg.render(cost, height=180)
    return out


def _time_unit(span_s: float) -> tuple[float, str]:
    """Seconds for a job of a few minutes (a test run), minutes up to a few hours."""
    if span_s < 300:
        return 1.0, "seconds"
    return (60.0, "minutes") if span_s < 3 * 3600 else (3600.0, "hours")


def job_page(client: Client, job_id: str) -> str:
    """The page of one job: its incidents and its step times, culprits highlighted."""
    reader = Reader(client)
    first, last, world = reader.job_span(job_id)
    incidents = reader.job_incidents(job_id)
    worst = sorted(incidents, key=lambda i: -float(i["slowdown_pct"] or 0))
    colors: dict[int, str] = {}
    for inc in worst:
        if inc["rank"] is not None and int(inc["rank"]) not in colors and len(colors) < 6:
            colors[int(inc["rank"])] = CULPRIT if not colors else OTHERS[(len(colors) - 1) % 5]
    steps = reader.steps(job_id, first - 1, last + 1, list(colors))
    open_n = sum(1 for i in incidents if i["status"] == "open")
    cards = [(f"{world:,}", "ranks", ""), (_duration(last - first), "steps seen over", ""),
             (str(len(incidents)), "incidents", ""),
             (str(open_n), "open now", "sev-critical" if open_n else "")]
    known = [float(i["gpu_hours_lost"]) for i in incidents
             if i.get("gpu_hours_lost") is not None]
    if incidents and "gpu_hours_lost" in incidents[0]:
        cards.append((f"{sum(known):.3g}" if known else "n/a", "GPU-hours lost", ""))
    body = [f"<h1>Job {escape(job_id)}</h1>",
            f"<div class=\"sub\">steps from {_utc(first)} to {_utc(last)} UTC</div>",
            _cards(cards), "<h2>Step times</h2>"]
    scale, unit = _time_unit(last - first)
    markers = [svg.Marker((float(i["onset_ts"]) - first) / scale, f"{i['fault']} r{i['rank']}"
                          if i["rank"] is not None else str(i["fault"]), "#444")
               for i in worst[:6]]
    body.append(_step_chart(steps, first, colors, markers, f"{unit} since the first step",
                            scale=scale))
    body.append("<h2>Incidents</h2>")
    if not incidents:
        body.append("<p>No incident in this job.</p>")
    else:
        cols = ["incident", "status", "severity", "fault", "culprit", "root cause",
                "mitigation", "slowdown %", "onset (UTC)", "resolved (UTC)"]
        if "gpu_hours_lost" in incidents[0]:
            cols.append("GPU-h lost")
        rows = []
        for i in incidents:
            who = (f"rank {i['rank']}" if i["rank"] is not None else f"host {i['host']}") + (
                f" <-> {i['peer_rank']}" if i["peer_rank"] is not None else "")
            row = [i["incident_id"], i["status"], i["severity"], i["fault"], who,
                   str(i["root_cause"] or "-"), str(i["mitigation"] or "-"),
                   f"{i['slowdown_pct']:.1f}", _utc(i["onset_ts"]), _utc(i["resolved_ts"])]
            if "gpu_hours_lost" in i:
                row.append(_num(i["gpu_hours_lost"], "{:.3g}"))
            rows.append(row)
        body.append(_table(cols, rows, {"slowdown %", "GPU-h lost"}))
        body.append("<p class=\"sub\">One incident in detail: <code>failslow report "
                    "INCIDENT_ID</code>.</p>")
    return _page(f"failslow: job {job_id}", body)


__all__ = ["ReportError", "incident_page", "job_page"]
