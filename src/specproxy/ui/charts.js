// specproxy live page: the two charts, drawn as plain SVG from GET /api/stats/history.
// No library and no CDN. Each chart is an <svg> with data-* attributes the headless-browser
// test reads (data-points, and per series data-series); app.js calls renderCharts() after each
// poll of /api/stats. Uses app.js's isNum (both are classic scripts of one page).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const CHART = { width: 640, height: 230, left: 56, right: 12, top: 22, bottom: 28 };
// The control's colour, then the treatments' in order (two arms: speculative blue, baseline
// orange, as ever). A point's latency lists the treatments first and the control last.
const CONTROL_COLOR = "#d9822b";
const TREATMENT_COLORS = ["#1f6feb", "#2da44e", "#8250df", "#cf222e", "#0a7f8f", "#bf8700", "#6e7781"];

function armColors(history, metric) {
  const last = history.length ? history[history.length - 1].latency[metric] || {} : {};
  const arms = Object.keys(last);
  const colors = {};
  arms.forEach((arm, i) => {
    colors[arm] = i === arms.length - 1 ? CONTROL_COLOR : TREATMENT_COLORS[i % TREATMENT_COLORS.length];
  });
  return colors;
}

// The latency chart's key: one swatch per arm, in the chart's colours.
function fillKeys(colors) {
  const box = document.getElementById("latency-keys");
  if (!box || Object.keys(colors).length === 0) return;
  const spans = Object.entries(colors).map(([arm, color]) => {
    const span = document.createElement("span");
    span.className = "key";
    span.setAttribute("data-arm", arm);
    span.style.setProperty("--key-color", color);
    span.textContent = arm;
    return span;
  });
  box.replaceChildren(...spans.flatMap((s, i) => (i ? [document.createTextNode(" "), s] : [s])));
}
let chartLabels = {};  // {metric: label}, from the stats result's settings (see app.js)

function svgEl(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

// 1-2-5 ticks covering [lo, hi], about `count` of them.
function niceTicks(lo, hi, count) {
  if (!(hi > lo)) { hi = lo + 1; }
  const raw = (hi - lo) / Math.max(1, count);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    ticks.push(Number(v.toPrecision(12)));
  }
  return ticks;
}

function timeLabel(t, span) {
  const hms = new Date(t * 1000).toISOString().slice(11, 19);  // UTC, as the status line
  return span < 3600 ? hms : hms.slice(0, 5);
}

// A chart frame: axes, ticks and labels; returns scale functions and the svg.
function frame(svg, xs, yLo, yHi, yFormat, yTitle) {
  const w = CHART.width - CHART.left - CHART.right;
  const h = CHART.height - CHART.top - CHART.bottom;
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  if (x1 === x0) { x0 -= 30; x1 += 30; }  // one stats run so far: centre it
  const span = Math.max(1, x1 - x0);
  const sx = (t) => CHART.left + ((t - x0) / span) * w;
  const sy = (v) => CHART.top + h - ((v - yLo) / (yHi - yLo)) * h;
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${CHART.width} ${CHART.height}`);
  svg.appendChild(svgEl("rect", { x: CHART.left, y: CHART.top, width: w, height: h, class: "plot" }));
  for (const v of niceTicks(yLo, yHi, 5)) {
    if (v < yLo || v > yHi) continue;
    svg.appendChild(svgEl("line", { x1: CHART.left, x2: CHART.left + w, y1: sy(v), y2: sy(v), class: "grid" }));
    svg.appendChild(svgEl("text", { x: CHART.left - 6, y: sy(v) + 4, class: "tick", "text-anchor": "end" }, yFormat(v)));
  }
  let xTicks = niceTicks(x0, x1, 5).filter((t) => t >= x0 && t <= x1);
  if (xTicks.length === 0) xTicks = x1 > x0 ? [x0, x1] : [x0];  // a short run: its ends
  for (const t of xTicks) {
    const anchor = sx(t) > CHART.left + w - 30 ? "end" : sx(t) < CHART.left + 30 ? "start" : "middle";
    svg.appendChild(svgEl("text", { x: sx(t), y: CHART.top + h + 18, class: "tick", "text-anchor": anchor }, timeLabel(t, span)));
  }
  svg.appendChild(svgEl("text", { x: 4, y: 12, class: "axis-title" }, yTitle));
  return { sx, sy };
}

function pathOf(points) {
  return points.map(([x, y], i) => (i ? "L" : "M") + x.toFixed(1) + " " + y.toFixed(1)).join(" ");
}

// Speedup of one metric and statistic over time: the estimate as a line, the CI as a band, 1 dashed.
function drawSpeedup(svg, history, metric, stat) {
  const pts = history.filter((p) => p.speedup[metric] && p.speedup[metric][stat]);
  svg.setAttribute("data-points", String(pts.length));
  if (pts.length === 0) {
    svg.replaceChildren(svgEl("text", { x: 20, y: 40, class: "empty" }, "no " + stat + " speedup yet (too few samples)"));
    return;
  }
  const values = pts.flatMap((p) => p.speedup[metric][stat]).concat([1]);
  const pad = 0.05 * (Math.max(...values) - Math.min(...values) || 1);
  const { sx, sy } = frame(svg, pts.map((p) => p.t), Math.min(...values) - pad, Math.max(...values) + pad,
    (v) => v.toFixed(2) + "x", "speedup (" + (pts[pts.length - 1].ratio || ["baseline", "speculative"]).join(" / ") + ")");
  const upper = pts.map((p) => [sx(p.t), sy(p.speedup[metric][stat][2])]);
  const lower = pts.map((p) => [sx(p.t), sy(p.speedup[metric][stat][1])]).reverse();
  svg.appendChild(svgEl("path", { d: pathOf(upper.concat(lower)) + " Z", class: "band", "data-series": "ci" }));
  svg.appendChild(svgEl("line", { x1: CHART.left, x2: CHART.width - CHART.right, y1: sy(1), y2: sy(1), class: "one" }));
  svg.appendChild(svgEl("path", { d: pathOf(pts.map((p) => [sx(p.t), sy(p.speedup[metric][stat][0])])), class: "estimate", "data-series": "estimate" }));
  for (const p of pts) {  // a marker per stats run, so even the first one shows
    const [est, lo, hi] = p.speedup[metric][stat];
    svg.appendChild(svgEl("line", { x1: sx(p.t), x2: sx(p.t), y1: sy(lo), y2: sy(hi), class: "ci-bar" }));
    svg.appendChild(svgEl("circle", { cx: sx(p.t), cy: sy(est), r: 2.5, class: "point" }));
  }
  const last = pts[pts.length - 1].speedup[metric][stat];
  svg.setAttribute("data-last", last.join(","));
}

// Median (solid) and P99 (dashed) latency per arm over time, in ms.
function drawLatency(svg, history, metric) {
  const series = [];
  const ARM_COLORS = armColors(history, metric);
  fillKeys(ARM_COLORS);
  for (const arm of Object.keys(ARM_COLORS)) {
    for (const stat of ["median", "p99"]) {
      const pts = history.filter((p) => isNum((p.latency[metric][arm] || {})[stat]))
        .map((p) => [p.t, p.latency[metric][arm][stat] * 1e3]);
      if (pts.length) series.push({ arm, stat, pts });
    }
  }
  svg.setAttribute("data-points", String(series.reduce((n, s) => n + s.pts.length, 0)));
  if (series.length === 0) {
    svg.replaceChildren(svgEl("text", { x: 20, y: 40, class: "empty" }, "no latency yet"));
    return;
  }
  const all = series.flatMap((s) => s.pts.map((p) => p[1]));
  const { sx, sy } = frame(svg, series.flatMap((s) => s.pts.map((p) => p[0])), 0, Math.max(...all) * 1.05,
    (v) => String(Math.round(v)), (chartLabels[metric] || metric) + " latency, ms");
  for (const s of series) {
    svg.appendChild(svgEl("path", {
      d: pathOf(s.pts.map(([t, v]) => [sx(t), sy(v)])),
      class: "arm " + s.stat, stroke: ARM_COLORS[s.arm], "data-series": s.arm + " " + s.stat,
    }));
    for (const [t, v] of s.pts) {
      svg.appendChild(svgEl("circle", { cx: sx(t), cy: sy(v), r: 2, fill: ARM_COLORS[s.arm] }));
    }
  }
}

// One <option> per metric the result declares, keeping the current choice.
function fillMetricPicker(labels) {
  const pick = document.getElementById("chart-metric");
  const names = Object.keys(labels);
  if (names.join(",") === Array.from(pick.options, (o) => o.value).join(",")) return;
  const chosen = names.includes(pick.value) ? pick.value : names[0];
  pick.replaceChildren(...names.map((n) => {
    const option = document.createElement("option");
    option.value = n;
    option.textContent = labels[n];
    return option;
  }));
  pick.value = chosen;
}

async function renderCharts(labels) {
  if (labels) {
    chartLabels = labels;
    fillMetricPicker(labels);
  }
  let history;
  try {
    const resp = await fetch("/api/stats/history", { cache: "no-store" });
    if (!resp.ok) return;
    history = await resp.json();
  } catch (err) {
    return;
  }
  const metric = document.getElementById("chart-metric").value;
  const stat = document.getElementById("chart-stat").value;
  drawSpeedup(document.getElementById("speedup-chart"), history, metric, stat);
  drawLatency(document.getElementById("latency-chart"), history, metric);
  document.getElementById("charts").setAttribute("data-history", String(history.length));
}

for (const id of ["chart-metric", "chart-stat"]) {
  document.getElementById(id).addEventListener("change", renderCharts);
}
