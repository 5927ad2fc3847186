// specproxy live page: polls /api/stats and renders the whole-run comparison.
// The choices and number formats mirror specproxy/report/summary.py, so the page, the demo's
// terminal view and the report print identical numbers. Every number cell also carries the raw
// JSON value in data-value, which the headless-browser test compares with /api/stats.
// The metrics and statistics are not listed here: the result names them in `settings`
// (`metrics`: {name: {column, label}}, `statistics`: [...]), from specproxy/stats/result.py.
"use strict";

const ARMS = ["speculative", "baseline"];
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

function renderVerdicts(win, METRICS) {
  const box = document.getElementById("verdicts");
  box.replaceChildren();
  for (const [metric, label] of Object.entries(METRICS)) {
    const verdict = String(win.metrics[metric].verdict);
    const seq = win.metrics[metric].sequential || {};
    const by = (seq.decided_by || []).join(", "); // the anytime-valid tests behind the verdict
    const attrs = { class: "verdict " + verdict, "data-metric": metric, "data-decided-by": by };
    if (by) attrs.title = "decided by: " + by;
    const div = el("div", attrs, label);
    div.appendChild(el("b", { class: "verdict-value" }, verdict));
    box.appendChild(div);
  }
  const diag = win.diagnosis || {};
  document.getElementById("diagnosis-summary").textContent =
    "diagnosis: " + (diag.summary || "-");
  const list = document.getElementById("diagnosis-reasons");
  list.replaceChildren(...(diag.reasons || []).map((r) => el("li", { "data-code": r.code }, r.message)));
}

function renderSpeedups(win, METRICS, STATISTICS) {
  const head = document.querySelector("#speedups thead tr");
  head.replaceChildren(el("th", {}, "metric"), ...STATISTICS.map((s) => el("th", {}, s)));
  const body = document.querySelector("#speedups tbody");
  body.replaceChildren();
  for (const [metric, label] of Object.entries(METRICS)) {
    const tr = el("tr", { "data-metric": metric });
    tr.appendChild(el("td", {}, label));
    for (const stat of STATISTICS) {
      const s = win.metrics[metric].speedup[stat] || {};
      const td = el("td", { "data-metric": metric, "data-stat": stat, "data-status": s.status || "" });
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
}

function renderArms(win) {
  const body = document.querySelector("#arms tbody");
  body.replaceChildren();
  const m = win.metrics;
  for (const arm of ARMS) {
    const tr = el("tr", { "data-arm": arm });
    const e2e = m.e2e.summary[arm] || {};
    const ttft = (m.ttft.summary[arm] || {}).median;
    const tpot = (m.tpot.summary[arm] || {}).median;
    const engine = (win.engine || {})[arm] || {};
    const n = m.e2e.n[arm] || 0;
    tr.appendChild(el("td", {}, arm));
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
    renderArms(win);
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
