// specproxy live page: polls /api/stats and renders the whole-run comparison.
// The choices and number formats mirror specproxy/report/summary.py, so the page, the demo's
// terminal view and the report print identical numbers. Every number cell also carries the raw
// JSON value in data-value, which the headless-browser test compares with /api/stats.
// The metrics and statistics are not listed here: the result names them in `settings`
// (`metrics`: {name: {column, label}}, `statistics`: [...]), from specproxy/stats/result.py.
// Nor are the arms: the window names its `control` and `treatments` (A/B/n, 2-8 arms), and
// `comparisons` holds each treatment's comparison with the control; a result stored before
// A/B/n reads as the shorthand ("baseline" against "speculative"), as summary.arms_of does.
"use strict";

const SHORTHAND_CONTROL = "baseline";
const SHORTHAND_TREATMENT = "speculative";
const params = new URLSearchParams(window.location.search);
const INTERVAL_S = Math.max(0.2, Number(params.get("interval") || 2));

// A Unix time as UTC ISO-8601 to the second ("2026-12-04T13:15:00Z"), whatever the browser's zone.
function utcTime(t) {
  return new Date(t * 1000).toISOString().slice(0, 19) + "Z";
}

function isNum(x) { return typeof x === "number" && Number.isFinite(x); }
function fmtMs(s) { return isNum(s) ? (s * 1e3).toFixed(1) + " ms" : "-"; }
function fmtRatio(x) { return isNum(x) ? x.toFixed(3) + "x" : "-"; }
function fmtPct(x) { return isNum(x) ? (x * 100).toFixed(1) + "%" : "-"; }
function fmtCi(b) {
  return isNum(b.lower) && isNum(b.upper)
    ? "[" + b.lower.toFixed(3) + ", " + b.upper.toFixed(3) + "]" : "-";
}

// Same rule as summary.main_window: all models over the whole run (results.all.all), else the
// longest window.
function mainWindow(result) {
  const results = result && result.results;
  if (!results || typeof results !== "object" || Object.keys(results).length === 0) return null;
  const perWindow = results.all || results[Object.keys(results).sort()[0]];
  if (!perWindow || typeof perWindow !== "object" || Object.keys(perWindow).length === 0) return null;
  const seconds = (k) => (isNum((perWindow[k] || {}).window_s) ? perWindow[k].window_s : Infinity);
  const key = "all" in perWindow ? "all"
    : Object.keys(perWindow).reduce((a, b) => (seconds(b) > seconds(a) ? b : a));
  return perWindow[key] || null;
}

// summary.arms_of: [control, [treatments]]; summary.shown_arms lists the treatments first.
function armsOf(win) {
  const control = win.control || SHORTHAND_CONTROL;
  let treatments = win.treatments;
  if (!Array.isArray(treatments) || treatments.length === 0) {
    treatments = win.comparisons && Object.keys(win.comparisons).length
      ? Object.keys(win.comparisons)
      : [Object.keys(win.samples || {}).find((a) => a !== control) || SHORTHAND_TREATMENT];
  }
  return [control, treatments];
}

// summary.comparison_of: a treatment's comparison (the first treatment's is the window).
function comparisonOf(win, treatment) {
  return (win.comparisons || {})[treatment] || win;
}

function fmtLoad(x) { return isNum(x) ? x.toFixed(1) : "-"; }

// summary.best_line: null with one treatment.
function bestLine(win) {
  const best = win.best;
  if (!best || best.state === "single") return null;
  const [control] = armsOf(win);
  if (best.leader === null || best.leader === undefined
      || best.runner_up === null || best.runner_up === undefined) {
    return "no winner yet: " + best.reason;
  }
  const m = best.margin;
  const over = m ? fmtRatio(m.estimate) + " " + fmtCi(m) : "-";
  const speedup = fmtRatio((best.speedups || {})[best.leader]);
  const head = best.state === "winner"
    ? "best: " + best.leader + ", " + speedup + " over " + control
    : "no winner yet: " + best.leader + " leads, " + speedup + " over " + control;
  return head + "; " + over + " over the runner-up " + best.runner_up;
}

// summary.crossover_text
function crossoverText(found) {
  const seen = found.observed;
  const span = seen ? " (" + fmtLoad(seen[0]) + "-" + fmtLoad(seen[1]) + ")" : "";
  if (found.status === "helps_throughout") return "helps at every load observed" + span;
  if (found.status === "costs_throughout") return "costs at every load observed" + span;
  if (found.status !== "ok") return "too little data";
  return "crosses 1 at load " + fmtLoad(found.load) + " [" + fmtLoad(found.lower) + ", "
    + fmtLoad(found.upper) + "]: " + fmtRatio(found.speedup_below) + " below, "
    + fmtRatio(found.speedup_above) + " above";
}

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function numCell(text, value, attrs) {
  const td = el("td", attrs || {}, text);
  td.setAttribute("data-value", value === null || value === undefined ? "" : String(value));
  return td;
}

// {metric: label} and [statistic] as the result declares them.
function metricLabels(result) {
  const metrics = (result.settings || {}).metrics || {};
  return Object.fromEntries(Object.entries(metrics).map(([name, m]) => [name, m.label]));
}

function statisticList(result) {
  return (result.settings || {}).statistics || [];
}

// One block per treatment in `box` (data-treatment); a heading names it only with several.
function treatmentBlock(box, treatment, control, several) {
  const div = el("div", { class: "comparison", "data-treatment": treatment });
  if (several) div.appendChild(el("h3", {}, treatment + " against " + control));
  box.appendChild(div);
  return div;
}

function renderVerdicts(win, METRICS) {
  const [control, treatments] = armsOf(win);
  const several = treatments.length > 1;
  const line = bestLine(win);
  const best = document.getElementById("best");
  best.hidden = line === null;
  best.replaceChildren();
  if (line !== null) {
    best.setAttribute("data-state", win.best.state);
    best.appendChild(el("b", { class: "best-line" }, line));
    best.appendChild(el("span", { class: "sub best-reason" }, win.best.reason));
  }
  const box = document.getElementById("verdicts");
  box.replaceChildren();
  for (const treatment of treatments) {
    const cmp = comparisonOf(win, treatment);
    const block = treatmentBlock(box, treatment, control, several);
    const row = el("div", { class: "verdicts" });
    for (const [metric, label] of Object.entries(METRICS)) {
      const verdict = String(cmp.metrics[metric].verdict);
      const seq = cmp.metrics[metric].sequential || {};
      const by = (seq.decided_by || []).join(", "); // the anytime-valid tests behind the verdict
      const attrs = { class: "verdict " + verdict, "data-metric": metric, "data-decided-by": by,
        "data-treatment": treatment };
      if (by) attrs.title = "decided by: " + by;
      const div = el("div", attrs, label);
      div.appendChild(el("b", { class: "verdict-value" }, verdict));
      row.appendChild(div);
    }
    block.appendChild(row);
    const diag = cmp.diagnosis || {};
    block.appendChild(el("p", { class: "diagnosis", "data-treatment": treatment },
      "diagnosis: " + (diag.summary || "-")));
    const list = el("ul", { class: "sub diagnosis-reasons" });
    list.replaceChildren(...(diag.reasons || []).map((r) => el("li", { "data-code": r.code }, r.message)));
    block.appendChild(list);
  }
}

function renderSpeedups(win, METRICS, STATISTICS) {
  const [control, treatments] = armsOf(win);
  const several = treatments.length > 1;
  document.getElementById("speedups-ratio").textContent = several
    ? control + " / each treatment; above 1: the treatment is faster"
    : control + " / " + treatments[0] + "; above 1: speculation is faster";
  const box = document.getElementById("speedups");
  box.replaceChildren();
  for (const treatment of treatments) {
    const cmp = comparisonOf(win, treatment);
    const block = treatmentBlock(box, treatment, control, several);
    const table = el("table", { class: "speedups", "data-treatment": treatment });
    const head = el("tr");
    head.replaceChildren(el("th", {}, "metric"), ...STATISTICS.map((s) => el("th", {}, s)));
    table.appendChild(el("thead")).appendChild(head);
    const body = table.appendChild(el("tbody"));
    for (const [metric, label] of Object.entries(METRICS)) {
      const tr = el("tr", { "data-metric": metric });
      tr.appendChild(el("td", {}, label));
      for (const stat of STATISTICS) {
        const s = cmp.metrics[metric].speedup[stat] || {};
        const td = el("td", { "data-metric": metric, "data-stat": stat, "data-status": s.status || "",
          "data-treatment": treatment });
        if (s.status === "ok") {
          td.appendChild(el("span", { class: "estimate", "data-value": String(s.estimate) }, fmtRatio(s.estimate)));
          const ci = el("span", { class: "ci", "data-lower": String(s.lower), "data-upper": String(s.upper) }, fmtCi(s));
          td.appendChild(ci);
        } else {
          const needed = Math.max(0, ...Object.values(s.n_needed || {}));
          td.appendChild(el("span", { class: "ci" }, "needs " + needed + " more per arm"));
        }
        tr.appendChild(td);
      }
      body.appendChild(tr);
    }
    block.appendChild(table);
  }
}

// Each treatment's speedups by condition and its crossover (summary.condition_rows), where the
// window has them (the whole run of all models, read from rows).
function renderConditions(win, METRICS) {
  const [control, treatments] = armsOf(win);
  const several = treatments.length > 1;
  const box = document.getElementById("conditions");
  box.replaceChildren();
  let any = false;
  for (const treatment of treatments) {
    const cond = comparisonOf(win, treatment).conditions;
    if (!cond || typeof cond !== "object") continue;
    any = true;
    const block = treatmentBlock(box, treatment, control, several);
    const metrics = Object.keys(cond.crossover || {});
    const cross = el("ul", { class: "crossover" });
    for (const metric of metrics) {
      const found = cond.crossover[metric];
      cross.appendChild(el("li", { "data-treatment": treatment, "data-metric": metric,
        "data-status": found.status, "data-load": found.load === null ? "" : String(found.load) },
        (METRICS[metric] || metric) + " crossover: " + crossoverText(found)));
    }
    block.appendChild(cross);
    if (cond.summary) block.appendChild(el("p", { class: "sub crossover-summary" }, cond.summary));
    const segMetrics = Array.from(new Set(Object.values(cond.segments || {}).flatMap((m) => Object.keys(m))));
    const table = el("table", { class: "segments", "data-treatment": treatment });
    const head = el("tr");
    head.replaceChildren(el("th", {}, "condition"), el("th", {}, "band"),
      ...segMetrics.map((m) => el("th", {}, (METRICS[m] || m) + " " + cond.statistic)));
    table.appendChild(el("thead")).appendChild(head);
    const body = table.appendChild(el("tbody"));
    for (const [dim, perMetric] of Object.entries(cond.segments || {})) {
      const bands = new Map();
      for (const [metric, found] of Object.entries(perMetric)) {
        for (const band of found) {
          if (!bands.has(band.band)) bands.set(band.band, {});
          bands.get(band.band)[metric] = band;
        }
      }
      for (const [name, cells] of bands) {
        const tr = el("tr", { "data-dimension": dim, "data-band": name });
        tr.appendChild(el("td", {}, dim));
        tr.appendChild(el("td", {}, name));
        for (const metric of segMetrics) {
          const b = cells[metric];
          const ok = b && b.status === "ok";
          const td = el("td", { "data-treatment": treatment, "data-dimension": dim, "data-band": name,
            "data-metric": metric, "data-status": b ? b.status : "" });
          td.appendChild(el("span", { class: "estimate", "data-value": ok ? String(b.speedup) : "" },
            ok ? fmtRatio(b.speedup) : "-"));
          td.appendChild(el("span", { class: "ci" }, ok ? fmtCi(b) : "too little data"));
          tr.appendChild(td);
        }
        body.appendChild(tr);
      }
    }
    block.appendChild(table);
  }
  document.getElementById("conditions-section").hidden = !any;
}

// summary.arm_labels_text: an arm's configured labels beside its name ("" without any)
function armLabelsText(result, arm) {
  const labels = ((result && result.arm_labels) || {})[arm] || {};
  return Object.entries(labels).map(([key, value]) => `${key}=${value}`).join(", ");
}

function renderArms(win, result) {
  const body = document.querySelector("#arms tbody");
  body.replaceChildren();
  const [control, treatments] = armsOf(win);
  for (const arm of [...treatments, control]) {
    // summary.arm_figures: a treatment's figures from its comparison, the control's from the window
    const held = arm === control ? win : comparisonOf(win, arm);
    const m = held.metrics;
    const tr = el("tr", { "data-arm": arm });
    const e2e = m.e2e.summary[arm] || {};
    const ttft = (m.ttft.summary[arm] || {}).median;
    const tpot = (m.tpot.summary[arm] || {}).median;
    const engine = (held.engine || {})[arm] || {};
    const n = m.e2e.n[arm] || 0;
    const name = el("td", {}, arm);
    const labels = armLabelsText(result, arm);
    if (labels) {
      name.appendChild(document.createTextNode(" "));
      name.appendChild(el("span", { class: "labels" }, labels));
    }
    tr.appendChild(name);
    tr.appendChild(numCell(String(n), n, { "data-field": "n" }));
    tr.appendChild(numCell(fmtMs(e2e.median), e2e.median, { "data-field": "e2e_median" }));
    tr.appendChild(numCell(fmtMs(e2e.p99), e2e.p99, { "data-field": "e2e_p99" }));
    tr.appendChild(numCell(fmtMs(ttft), ttft, { "data-field": "ttft_median" }));
    tr.appendChild(numCell(fmtMs(tpot), tpot, { "data-field": "tpot_median" }));
    tr.appendChild(numCell(fmtPct(engine.acceptance_rate), engine.acceptance_rate, { "data-field": "acceptance_rate" }));
    const length = engine.mean_acceptance_length;
    tr.appendChild(numCell(isNum(length) ? length.toFixed(2) : "-", length, { "data-field": "mean_acceptance_length" }));
    body.appendChild(tr);
  }
}

function setStatus(text, isError) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.className = isError ? "sub error" : "sub";
}

async function poll() {
  try {
    const resp = await fetch("/api/stats", { cache: "no-store" });
    if (resp.status === 503) {
      setStatus("waiting for the first stats run…", false);
      return;
    }
    if (!resp.ok) throw new Error("HTTP " + resp.status);
    const result = await resp.json();
    const win = mainWindow(result);
    if (!win) {
      setStatus("no comparison yet", false);
      return;
    }
    renderVerdicts(win, metricLabels(result));
    renderSpeedups(win, metricLabels(result), statisticList(result));
    renderConditions(win, metricLabels(result));
    renderArms(win, result);
    const when = isNum(result.computed_at)
      ? utcTime(result.computed_at) : "?";
    const run = result.run_id ? "run " + result.run_id + ", " : "";
    setStatus(run + "stats computed at " + when + ", design " + (win.design || "split"), false);
    document.body.setAttribute("data-computed-at", String(result.computed_at));
    if (typeof renderCharts === "function") await renderCharts(metricLabels(result));  // charts.js
  } catch (err) {
    setStatus("cannot read /api/stats: " + err.message, true);
  }
}

document.getElementById("interval").textContent = String(INTERVAL_S);
poll();
setInterval(poll, INTERVAL_S * 1000);
