"""The report's single HTML file: inline CSS, figures embedded as base64 PNG, no scripts.

It must read well on its own (mailed, attached to a ticket, opened with no Grafana and no
network), so it leads with the verdicts and the speedups, then the figures, then how the numbers
were produced. A/B/n: the best-configuration line, then per treatment its verdicts, speedups,
diagnosis and speedups by condition (a heading names the treatment only when there are several;
two arms read as they always did).
"""

from __future__ import annotations

import base64
import datetime as dt
import html

from specproxy.report.data import ReportData
from specproxy.report.summary import (
    METRICS,
    STATISTICS,
    arm_figures,
    arm_labels_text,
    arms_of,
    band_text,
    best_line,
    comparison_of,
    condition_rows,
    conditions_of,
    crossover_text,
    fmt_ci,
    fmt_ms,
    fmt_ratio,
    main_window,
    needed_more,
    shown_arms,
)
from specproxy.stats.result import StatsResult, WindowResult

__all__ = ["render_html"]

_CSS = """
body { font: 15px/1.45 system-ui, sans-serif; color: #1d2330; max-width: 1000px;
       margin: 2em auto; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
.sub { color: #667; }
.labels { color: #667; font-size: 0.85em; }
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
h3 { font-size: 1.05em; margin: 1em 0 0.3em; }
.crossover { margin: 0.3em 0; }
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
        parts += _arms(window, data.stats)
        parts += _diagnosis(window)
        parts += _conditions(window)
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


def _heading(window: WindowResult, treatment: str) -> str:
    """A treatment's sub-heading, only with several treatments."""
    control, treatments = arms_of(window)
    if len(treatments) < 2:
        return ""
    return f"<h3 data-treatment='{_e(treatment)}'>{_e(treatment)} against {_e(control)}</h3>"


def _best(window: WindowResult) -> list[str]:
    line = best_line(window)
    best = window.get("best")
    if line is None or best is None:
        return []
    return [
        f"<p id='best' data-state='{_e(best['state'])}'><b>{_e(line)}</b><br>"
        f"<span class='sub'>{_e(best['reason'])}</span></p>"
    ]


def _verdicts(window: WindowResult) -> list[str]:
    control, treatments = arms_of(window)
    out = ["<h2>Verdicts</h2>", *_best(window)]
    for treatment in treatments:
        out += [_heading(window, treatment), "<div class='verdicts'>"]
        metrics = comparison_of(window, treatment)["metrics"]
        for metric, label in METRICS.items():
            block = metrics[metric]
            verdict = block["verdict"]
            seq = block["sequential"]
            by = [_DECIDED_BY.get(t, t) for t in (seq.get("decided_by", []) if seq else [])]
            note = f"<small>by {_e(', '.join(by))}</small>" if by else ""
            out.append(
                f"<div class='verdict {_e(verdict)}' data-metric='{metric}' "
                f"data-treatment='{_e(treatment)}'>{label}<b>{_e(verdict)}</b>{note}</div>"
            )
        out.append("</div>")
    if len(treatments) == 1:
        treated = f"the {_e(treatments[0])} median"
        against = f"the {_e(control)}'s"
        level = ""
    else:
        treated = "a treatment's median"
        against = f"the control's ({_e(control)})"
        multiplicity = window.get("multiplicity")
        level = (
            f" Each of the {multiplicity['treatments']} comparisons is tested at alpha / "
            f"{multiplicity['treatments']} = {multiplicity['alpha_per_comparison']:.3g} "
            "(Bonferroni), so the error rate holds for the whole family."
            if multiplicity is not None
            else ""
        )
    out.append(
        "<p class='sub'>From anytime-valid tests: confidence sequences on the median and the "
        "P99, and for the P99 also a per-minute exceedance test that stays valid under load "
        "waves (on mirrored pairs a two-sample test instead; each P99 test at half the error "
        "rate). "
        f"<i>slower</i> means {treated}, or its P99 beyond the tolerance, is above "
        f"{against}; <i>faster</i> that one of them is below and neither is above; the "
        f"error rate holds however often the result was looked at.{level}</p>"
    )
    return out


def _speedups(window: WindowResult) -> list[str]:
    control, treatments = arms_of(window)
    if len(treatments) == 1:
        ratio = f"{_e(control)} / {_e(treatments[0])} for the statistic; above 1 means speculation"
    else:
        ratio = f"{_e(control)} / the treatment for the statistic; above 1 means the treatment"
    out = [f"<h2>Speedups</h2><p class='sub'>speedup = {ratio} is faster.</p>"]
    for i, treatment in enumerate(treatments):
        ident = " id='speedups'" if i == 0 else ""
        out += [
            _heading(window, treatment),
            f"<table{ident} class='speedups' data-treatment='{_e(treatment)}'><tr><th>metric</th>",
        ]
        out += [f"<th>{s}</th>" for s in STATISTICS]
        out.append("</tr>")
        metrics = comparison_of(window, treatment)["metrics"]
        for metric, label in METRICS.items():
            out.append(f"<tr><td>{label}</td>")
            for stat in STATISTICS:
                s = metrics[metric]["speedup"].get(stat)
                if s is not None and s["status"] == "ok":
                    cell = f"{fmt_ratio(s['estimate'])} <span class='sub'>{fmt_ci(s)}</span>"
                else:
                    cell = f"<span class='sub'>needs {needed_more(s)} more per arm</span>"
                out.append(
                    f"<td data-metric='{metric}' data-stat='{stat}' "
                    f"data-treatment='{_e(treatment)}'>{cell}</td>"
                )
            out.append("</tr>")
        out.append("</table>")
    return out


def _arms(window: WindowResult, result: StatsResult | None) -> list[str]:
    out = [
        "<h2>Per arm</h2><table id='arms'><tr><th>arm</th><th>n</th><th>E2E median</th>"
        "<th>E2E P90</th><th>E2E P99</th><th>TTFT median</th><th>TPOT median</th>"
        "<th>acceptance</th><th>mean acceptance length</th></tr>"
    ]
    for arm in shown_arms(window):
        f = arm_figures(window, arm)
        rate, length = f["acceptance_rate"], f["mean_acceptance_length"]
        out.append(
            f"<tr data-arm='{_e(arm)}'><td>{_e(arm)}{_labels(result, arm)}</td><td>{f['n']}</td>"
            f"<td>{fmt_ms(f['e2e_median'])}</td><td>{fmt_ms(f['e2e_p90'])}</td>"
            f"<td>{fmt_ms(f['e2e_p99'])}</td>"
            f"<td>{fmt_ms(f['ttft_median'])}</td>"
            f"<td>{fmt_ms(f['tpot_median'])}</td>"
            f"<td>{f'{rate:.1%}' if rate is not None else '-'}</td>"
            f"<td>{f'{length:.2f}' if length is not None else '-'}</td></tr>"
        )
    out.append("</table>")
    return out


def _labels(result: StatsResult | None, arm: str) -> str:
    """The arm's configured labels beside its name ("" without any)."""
    text = arm_labels_text(result, arm)
    return f" <span class='labels'>{_e(text)}</span>" if text else ""


def _diagnosis(window: WindowResult) -> list[str]:
    _, treatments = arms_of(window)
    out = ["<h2>Diagnosis</h2>"]
    for treatment in treatments:
        diagnosis = comparison_of(window, treatment)["diagnosis"]
        out += [_heading(window, treatment), f"<ul data-treatment='{_e(treatment)}'>"]
        headline = "diagnosis: " + diagnosis["summary"]
        out.append(f"<li>{_e(headline)}</li>")
        out += [f"<li>{_e(r['message'])}</li>" for r in diagnosis["reasons"]]
        out.append("</ul>")
    return out


def _conditions(window: WindowResult) -> list[str]:
    """Each treatment's crossover per metric and its median speedup per condition band, where
    the window has them (the whole run of all models, read from rows)."""
    _, treatments = arms_of(window)
    held = [(t, conditions_of(window, t)) for t in treatments]
    if not any(c for _, c in held):
        return []
    out = [
        "<h2>By condition</h2><p class='sub'>The median speedup among the requests that met "
        "each condition (one condition at a time; a band shows no number while an arm has too "
        "few requests in it), and the load at which the speedup crosses 1.</p>"
    ]
    for treatment, conditions in held:
        if not conditions:
            continue
        t = _e(treatment)
        out += [_heading(window, treatment), f"<ul class='crossover' data-treatment='{t}'>"]
        for metric, found in conditions["crossover"].items():
            label = METRICS.get(metric, metric)
            out.append(
                f"<li data-metric='{metric}' data-status='{_e(found['status'])}'>"
                f"{_e(f'{label} crossover: {crossover_text(found)}')}</li>"
            )
        out.append("</ul>")
        if conditions["summary"]:
            out.append(f"<p class='sub'>{_e(conditions['summary'])}</p>")
        rows = condition_rows(conditions)
        shown = sorted({m for _, _, cells in rows for m in cells}, key=list(METRICS).index)
        out.append(
            f"<table class='segments' data-treatment='{t}'><tr><th>condition</th><th>band</th>"
            + "".join(f"<th>{METRICS.get(m, m)} {_e(conditions['statistic'])}</th>" for m in shown)
            + "</tr>"
        )
        for dim, band, cells in rows:
            out.append(f"<tr><td>{_e(dim)}</td><td>{_e(band)}</td>")
            for metric in shown:
                estimate, ci = band_text(cells.get(metric))
                out.append(
                    f"<td data-dimension='{_e(dim)}' data-band='{_e(band)}' "
                    f"data-metric='{metric}'>{estimate} <span class='sub'>{ci}</span></td>"
                )
            out.append("</tr>")
        out.append("</table>")
    return out


def _methodology(data: ReportData, window: WindowResult | None) -> list[str]:
    s = data.settings
    arms = shown_arms(window) if window is not None else ["speculative", "baseline"]
    n = {arm: arm_figures(window, arm)["n"] for arm in arms} if window is not None else {}
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
        ("Requests used (n per arm)", ", ".join(f"{a}: {n.get(a, 0)}" for a in arms)),
        (
            "Warm-up excluded",
            f"the time units holding the first {data.warmup.requests} successful requests per "
            "arm after the start, and after every engine restart the units holding its first "
            f"{data.warmup.restart_requests} and those within {data.warmup.restart_seconds:g} s; "
            "excluded here: " + ", ".join(f"{a}: {data.excluded_warmup.get(a, 0)}" for a in arms),
        ),
        (
            "Failed requests excluded",
            ", ".join(f"{a}: {data.excluded_failed.get(a, 0)}" for a in arms),
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
