"""The report's single HTML file: inline CSS, figures embedded as base64 PNG, no scripts.

It must read well on its own (mailed, attached to a ticket, opened with no Grafana and no
network), so it leads with the verdicts and the speedups, then the figures, then how the numbers
were produced.
"""

from __future__ import annotations

import base64
import datetime as dt
import html

from specproxy.report.data import ReportData
from specproxy.report.summary import (
    ARMS,
    METRICS,
    STATISTICS,
    diagnosis_lines,
    fmt_ci,
    fmt_ms,
    fmt_ratio,
    main_window,
    needed_more,
)
from specproxy.stats.result import WindowResult

__all__ = ["render_html"]

_CSS = """
body { font: 15px/1.45 system-ui, sans-serif; color: #1d2330; max-width: 1000px;
       margin: 2em auto; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
.sub { color: #667; }
table { border-collapse: collapse; margin: 0.6em 0; }
th, td { padding: 0.3em 0.8em; border-bottom: 1px solid #e4e6eb; text-align: right;
         white-space: nowrap; }
#methodology td { white-space: normal; }
th:first-child, td:first-child { text-align: left; }
.verdicts { display: flex; gap: 1em; flex-wrap: wrap; }
.verdict { padding: 0.6em 1em; border-radius: 6px; min-width: 9em; }
.verdict b { display: block; font-size: 1.2em; }
.faster { background: #e3f4e6; } .slower { background: #fbe3e1; }
.inconclusive { background: #eef0f3; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #e4e6eb; }
figcaption { color: #556; font-size: 0.9em; }
.grid { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
code { background: #f3f4f6; padding: 0 0.2em; }
"""

_FIGURES = [
    (
        "cdf_e2e",
        "End-to-end latency CDF per arm: further left is faster; dotted: P50, dashed: P99.",
    ),
    (
        "cdf_tpot",
        "Time per output token CDF per arm: decode speed, the quantity speculation targets.",
    ),
    (
        "cdf_ttft",
        "Time to first token CDF per arm: prefill and queueing; speculation should not change it.",
    ),
    (
        "speedup_time_median",
        "Median E2E speedup after each stats run, whole run so far; the band is the CI.",
    ),
    (
        "speedup_time_p99",
        "P99 E2E speedup over time; tail estimates need far more samples to settle.",
    ),
    ("acceptance", "Share of drafts accepted at each draft position, averaged over the scrapes."),
    (
        "speedup_load",
        "Median E2E speedup per load level (quantile bins of load), with bootstrap CIs.",
    ),
]


def render_html(data: ReportData) -> str:
    window = main_window(data.stats)
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>specproxy report: {_e(data.run_id)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Is speculative decoding faster? Run <code>{_e(data.run_id)}</code></h1>",
        f"<p class='sub'>{_span(data)}</p>",
    ]
    if window is None:
        parts.append("<p>No statistics could be computed for this run.</p>")
    else:
        parts += _verdicts(window)
        parts += _speedups(window)
        parts += _arms(window)
        parts += ["<h2>Diagnosis</h2><ul>"]
        parts += [f"<li>{_e(line.strip(' -'))}</li>" for line in diagnosis_lines(data.stats)]
        parts.append("</ul>")
    parts.append("<h2>Figures</h2><div class='grid'>")
    for name, caption in _FIGURES:
        png = data.figures.get(name)
        if png is None:
            continue
        b64 = base64.b64encode(png).decode()
        parts.append(
            f"<figure id='fig-{name}'><img alt='{_e(caption)}' src='data:image/png;base64,{b64}'>"
            f"<figcaption>{_e(caption)}</figcaption></figure>"
        )
    parts.append("</div>")
    parts += _methodology(data, window)
    parts.append("</body></html>")
    return "\n".join(parts)


# `sequential.decided_by` (`stats.sequential.Decision.decided_by`) in words
_DECIDED_BY = {
    "p99_union_bound": "P99 confidence sequences",
    "p99_two_sample": "P99 two-sample test",
    "p99_exceedance": "P99 per-minute exceedance test",
    "median": "median",
}


def _verdicts(window: WindowResult) -> list[str]:
    out = ["<h2>Verdicts</h2><div class='verdicts'>"]
    for metric, label in METRICS.items():
        block = window["metrics"][metric]
        verdict = block["verdict"]
        seq = block["sequential"]
        by = [_DECIDED_BY.get(t, t) for t in (seq.get("decided_by", []) if seq else [])]
        note = f"<small>by {_e(', '.join(by))}</small>" if by else ""
        out.append(
            f"<div class='verdict {_e(verdict)}' data-metric='{metric}'>{label}"
            f"<b>{_e(verdict)}</b>{note}</div>"
        )
    out.append("</div>")
    out.append(
        "<p class='sub'>From anytime-valid tests: confidence sequences on the median and the "
        "P99, and for the P99 also a per-minute exceedance test that stays valid under load "
        "waves (on mirrored pairs a two-sample test instead; each P99 test at half the error "
        "rate). "
        "<i>slower</i> means the speculative median, or its P99 beyond the tolerance, is above "
        "the baseline's; <i>faster</i> that one of them is below and neither is above; the "
        "error rate holds however often the result was looked at.</p>"
    )
    return out


def _speedups(window: WindowResult) -> list[str]:
    out = [
        "<h2>Speedups</h2><p class='sub'>speedup = baseline / speculative for the statistic; "
        "above 1 means speculation is faster.</p><table id='speedups'><tr><th>metric</th>",
    ]
    out += [f"<th>{s}</th>" for s in STATISTICS]
    out.append("</tr>")
    for metric, label in METRICS.items():
        out.append(f"<tr><td>{label}</td>")
        for stat in STATISTICS:
            s = window["metrics"][metric]["speedup"].get(stat)
            if s is not None and s["status"] == "ok":
                cell = f"{fmt_ratio(s['estimate'])} <span class='sub'>{fmt_ci(s)}</span>"
            else:
                cell = f"<span class='sub'>needs {needed_more(s)} more per arm</span>"
            out.append(f"<td data-metric='{metric}' data-stat='{stat}'>{cell}</td>")
        out.append("</tr>")
    out.append("</table>")
    return out


def _arms(window: WindowResult) -> list[str]:
    out = [
        "<h2>Per arm</h2><table id='arms'><tr><th>arm</th><th>n</th><th>E2E median</th>"
        "<th>E2E P90</th><th>E2E P99</th><th>TTFT median</th><th>TPOT median</th>"
        "<th>acceptance</th><th>mean acceptance length</th></tr>"
    ]
    metrics = window["metrics"]
    for arm in ARMS:
        e2e = metrics["e2e"]["summary"].get(arm, {})
        engine = window["engine"].get(arm)
        rate = engine["acceptance_rate"] if engine is not None else None
        length = engine["mean_acceptance_length"] if engine is not None else None
        out.append(
            f"<tr data-arm='{arm}'><td>{arm}</td><td>{metrics['e2e']['n'].get(arm, 0)}</td>"
            f"<td>{fmt_ms(e2e.get('median'))}</td><td>{fmt_ms(e2e.get('p90'))}</td>"
            f"<td>{fmt_ms(e2e.get('p99'))}</td>"
            f"<td>{fmt_ms(metrics['ttft']['summary'].get(arm, {}).get('median'))}</td>"
            f"<td>{fmt_ms(metrics['tpot']['summary'].get(arm, {}).get('median'))}</td>"
            f"<td>{f'{rate:.1%}' if rate is not None else '-'}</td>"
            f"<td>{f'{length:.2f}' if length is not None else '-'}</td></tr>"
        )
    out.append("</table>")
    return out


def _methodology(data: ReportData, window: WindowResult | None) -> list[str]:
    s = data.settings
    n = window["metrics"]["e2e"]["n"] if window is not None else {}
    design = window["design"] if window is not None else "split"
    design_text = (
        "paired: mirrored requests sent to both arms, resampled as pairs"
        if design == "paired"
        else "split: each request went to one arm at random; arms resampled independently"
    )
    rows = [
        (
            "What was measured",
            "Per request at the proxy: E2E from request received to last byte "
            "sent; TTFT to the first SSE event with content; TPOT = (E2E - TTFT) / (output tokens "
            "- 1). Arms are compared on the same traffic through the same proxy.",
        ),
        ("Requests used (n per arm)", ", ".join(f"{a}: {n.get(a, 0)}" for a in ARMS)),
        (
            "Warm-up excluded",
            f"the time units holding the first {data.warmup.requests} successful requests per "
            "arm after the start, and after every engine restart the units holding its first "
            f"{data.warmup.restart_requests} and those within {data.warmup.restart_seconds:g} s; "
            "excluded here: " + ", ".join(f"{a}: {data.excluded_warmup.get(a, 0)}" for a in ARMS),
        ),
        (
            "Failed requests excluded",
            ", ".join(f"{a}: {data.excluded_failed.get(a, 0)}" for a in ARMS),
        ),
        ("Design", design_text),
        (
            "Confidence intervals",
            f"percentile bootstrap of the ratio, {s.resamples} resamples, "
            f"{s.confidence:.0%} confidence",
        ),
        (
            "Verdicts",
            f"anytime-valid confidence sequences for the median and P99 of each arm, "
            f"alpha {s.alpha:g}, P99 tolerance {s.p99_tolerance:.0%}",
        ),
        (
            "Speedup against load",
            f"load = {data.load_source}; bins are load quantiles, CI by "
            "a percentile bootstrap of the median ratio within each bin",
        ),
        (
            "Source",
            f"the stats job's last result (at {_time(data.stats_t)}), whole-run window; "
            "the same JSON as GET /api/stats",
        ),
    ]
    out = ["<h2>Methodology</h2><table id='methodology'>"]
    out += [f"<tr><td>{_e(k)}</td><td style='text-align:left'>{_e(v)}</td></tr>" for k, v in rows]
    out.append("</table>")
    return out


def _span(data: ReportData) -> str:
    if data.span is None:
        return ""
    start, end = data.span
    seconds = end - start
    length = f"{seconds:.0f} s" if seconds < 300 else f"{seconds / 60:.1f} min"
    return f"Requests from {_time(start)} to {_time(end)} ({length})."


def _time(t: float | None) -> str:
    if t is None:
        return "-"
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)
