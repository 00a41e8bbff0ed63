// The operations page: polls GET /v1/ops/metrics (admin key, in a header) every POLL_MS. The JSON is the registry
// behind /metrics, read once per poll: every number shown is a sample of it (data-metric / data-labels /
// data-value hold the exact value) or, for p50 / p99, an estimate from its histogram buckets (data-quantile).
"use strict";

const POLL_MS = 2000;
const WINDOW_S = 30; // the charts' quantiles: observations of the last WINDOW_S seconds (bucket deltas)
const KEEP = 150; // snapshots kept for the charts (5 minutes)
const ADMIN = "linguafusion.admin-key";
const P = "linguafusion_";
const COLORS = ["#2357d9", "#c4302b", "#1b8a4b", "#b86e00", "#7a3fc4", "#0f8c99", "#c43f8e", "#5d6b00"];
const $ = (id) => document.getElementById(id);
// /ops?scope=cluster: every replica on the servers' shared Redis (GET /metrics/cluster), summed in the cards
const SCOPE = new URLSearchParams(location.search).get("scope") === "cluster" ? "cluster" : "server";
const history = [];
let paused = false;
let timer = null;

// Prometheus's histogram_quantile: linear inside the bucket holding the rank (api/opsview.py does the same).
function quantile(q, buckets) {
  const bs = buckets.map(([le, c]) => [le === "+Inf" ? Infinity : le, c]).sort((a, b) => a[0] - b[0]);
  if (!bs.length || bs[bs.length - 1][1] <= 0) return null;
  const rank = q * bs[bs.length - 1][1];
  let lowerBound = 0, lowerCount = 0;
  for (const [bound, count] of bs) {
    if (count >= rank) {
      if (bound === Infinity) return lowerBound;
      if (count === lowerCount) return bound;
      return lowerBound + (bound - lowerBound) * (rank - lowerCount) / (count - lowerCount);
    }
    lowerBound = bound;
    lowerCount = count;
  }
  return lowerBound;
}

const fmt = {
  n: (v) => (v === null || v === undefined ? "–" : Number.isInteger(v) ? v.toLocaleString("en") : v.toFixed(2)),
  s: (v) => (v === null || v === undefined ? "–" : v < 1 ? (v * 1000).toFixed(0) + " ms" : v.toFixed(2) + " s"),
  mib: (v) => (v / 1048576).toFixed(0) + " MiB",
};

// a cell holding one sample of /metrics
function sampleCell(tag, text, metric, labels, value, cls) {
  return LF.el(tag, { class: cls, text, "data-metric": metric, "data-labels": JSON.stringify(labels || {}),
    "data-value": String(value) });
}

function quantileCell(text, metric, labels, q, value) {
  return LF.el("td", { text, "data-histogram": metric, "data-labels": JSON.stringify(labels), "data-quantile": q,
    "data-value": value === null ? "" : String(value) });
}

function renderCards(sum) {
  const shed = Object.values(sum.shed).reduce((a, b) => a + b, 0);
  const cards = [
    ["active streams", fmt.n(sum.active_streams), P + "active_streams", {}, sum.active_streams],
    ["streams admitted", fmt.n(sum.streams_admitted), P + "streams_admitted_total", {}, sum.streams_admitted],
    ["streams refused", fmt.n(sum.streams_refused), P + "streams_rejected_total", {}, sum.streams_refused],
    ["streams refused: not serving now", fmt.n(sum.streams_unavailable), P + "streams_unavailable_total", {},
      sum.streams_unavailable],
    ["requests refused (429)", fmt.n(sum.requests_refused), P + "rejected_total", {}, sum.requests_refused],
    ["work items shed", fmt.n(shed), null, null, shed],
    ["memory (RSS)", fmt.mib(sum.memory_rss_bytes), "process_resident_memory_bytes", {}, sum.memory_rss_bytes],
    ["finals not yet logged", fmt.n(sum.unlogged_finals), P + "unlogged_finals", {}, sum.unlogged_finals],
  ];
  $("cards").replaceChildren(...cards.map(([name, text, metric, labels, value]) => LF.el("div", { class: "card" },
    LF.el("div", { class: "name", text: name }),
    metric ? sampleCell("div", text, metric, labels, value, "value" + (name.includes("refused") && value ? " bad" : ""))
      : LF.el("div", { class: "value", text }))));
}

function renderBreaker(sum) {
  // a class the breaker never moved has no sample yet: it is at level 0
  const classes = [...new Set(["interactive", "standard", "batch", ...Object.keys(sum.breaker)])];
  $("breaker").className = "";
  $("breaker").replaceChildren(...classes.map((slo) => {
    const level = sum.breaker[slo];
    const text = `${slo}: ${level ? "degraded, level " + level : "normal"}`;
    return level === undefined ? LF.el("span", { class: "breaker level0", text })
      : sampleCell("span", text, P + "degradation_level", { slo }, level, "breaker level" + Math.min(4, level));
  }),
  ...Object.entries(sum.breaker_transitions).map(([k, v]) => LF.el("span", { class: "muted small",
    text: ` ${k}: ${v}` })));
}

function table(id, head, rows, empty) {
  const t = $(id);
  if (!rows.length) {
    t.replaceChildren(LF.el("tr", {}, LF.el("td", { class: "empty", text: empty })));
    return;
  }
  t.replaceChildren(LF.el("tr", {}, ...head.map((h) => LF.el("th", { text: h }))), ...rows);
}

function histRow(name, metric, label, key, h, fmtValue) {
  const labels = { [label]: key };
  return [sampleCell("td", fmt.n(h.count), metric + "_count", labels, h.count),
    LF.el("td", { text: h.mean === null ? "–" : fmtValue(h.mean) }),
    quantileCell(fmtValue(h.p50), metric, labels, "0.5", h.p50),
    quantileCell(fmtValue(h.p99), metric, labels, "0.99", h.p99)];
}

function renderTables(sum) {
  table("table-stages", ["stage", "count", "mean", "p50", "p99"],
    Object.entries(sum.stages).map(([stage, h]) => LF.el("tr", {}, LF.el("td", { text: stage }),
      ...histRow(stage, P + "stage_latency_seconds", "stage", stage, h, fmt.s))), "no stage has run yet");
  table("table-captions", ["class", "captions", "mean", "p50", "p99", "p99 (HDR)", "p99.9 (HDR)"],
    Object.entries(sum.caption_latency).map(([slo, h]) => {
      const hdr = sum.caption_quantiles[slo] || {};
      const g = (q) => (hdr[q] === undefined ? LF.el("td", { text: "–" }) : sampleCell("td", fmt.s(hdr[q]),
        P + "caption_latency_quantile_seconds", { slo, quantile: q }, hdr[q]));
      return LF.el("tr", {}, LF.el("td", { text: slo }),
        ...histRow(slo, P + "caption_latency_seconds", "slo", slo, h, fmt.s), g("0.99"), g("0.999"));
    }), "no caption yet");
  const models = [...new Set([...Object.keys(sum.queue_depth), ...Object.keys(sum.batch_size),
    ...Object.keys(sum.shed)])].sort();
  table("table-models", ["model", "queue depth", "max depth", "shed", "batches", "mean batch", "p99 batch",
    "queue wait p99", "failed batches"], models.map((m) => {
    const labels = { model: m };
    const b = sum.batch_size[m];
    const w = sum.queue_wait[m];
    const num = (metric, v) => (v === undefined ? LF.el("td", { text: "–" }) : sampleCell("td", fmt.n(v), metric,
      labels, v));
    return LF.el("tr", {}, LF.el("td", { text: m }), num(P + "queue_depth", sum.queue_depth[m]),
      num(P + "queue_depth_max", sum.queue_depth_max[m]), num(P + "shed_total", sum.shed[m]),
      ...(b ? histRow(m, P + "batch_size", "model", m, b, (v) => (v === null ? "–" : v.toFixed(1))).slice(0, 2)
        : [LF.el("td", { text: "–" }), LF.el("td", { text: "–" })]),
      b ? quantileCell(b.p99 === null ? "–" : b.p99.toFixed(1), P + "batch_size", labels, "0.99", b.p99)
        : LF.el("td", { text: "–" }),
      w ? quantileCell(fmt.s(w.p99), P + "queue_wait_seconds", labels, "0.99", w.p99) : LF.el("td", { text: "–" }),
      LF.el("td", { text: fmt.n(sum.model_failures[m] || 0) }));
  }), "no model batch yet");
  table("table-errors", ["code", "count"], Object.entries(sum.errors).map(([code, n]) => LF.el("tr", {},
    LF.el("td", { text: code }), sampleCell("td", fmt.n(n), P + "errors_total", { code }, n))), "no error yet");
}

// ---- charts --------------------------------------------------------------------------------------------------
function windowQuantiles(family, q) {
  // one series per key of summary[family]: quantile q of the observations in the WINDOW_S before each snapshot
  const series = {};
  history.forEach((snap, i) => {
    let j = i;
    while (j > 0 && history[j - 1].time >= snap.time - WINDOW_S) j--;
    const before = j < i ? history[j] : null;
    for (const [key, h] of Object.entries(snap.summary[family])) {
      const old = before && before.summary[family][key];
      const delta = h.buckets.map(([le, c], k) => [le, c - (old ? old.buckets[k][1] : 0)]);
      (series[key] = series[key] || []).push([snap.time, before || i === 0 ? quantile(q, delta) : null]);
    }
  });
  return series;
}

function gaugeSeries(family) {
  const series = {};
  for (const snap of history) {
    for (const [key, v] of Object.entries(snap.summary[family])) (series[key] = series[key] || []).push([snap.time, v]);
  }
  return series;
}

function drawChart(svgId, legendId, lines, unit) {
  const svg = $(svgId);
  const W = 600, H = 220, L = 44, B = 18;
  const now = history.length ? history[history.length - 1].time : Date.now() / 1000;
  const span = Math.min(KEEP * POLL_MS / 1000, Math.max(60, history.length ? now - history[0].time : 0));
  const t0 = now - span; // the page's history so far (at least a minute, at most KEEP snapshots)
  let max = 0;
  for (const l of lines) for (const [, v] of l.points) if (v !== null) max = Math.max(max, v);
  max = max > 0 ? max * 1.15 : 1;
  const x = (t) => L + (W - L - 6) * (t - t0) / (now - t0 || 1);
  const y = (v) => H - B - (H - B - 8) * v / max;
  const ns = "http://www.w3.org/2000/svg";
  const node = (tag, attrs, text) => {
    const n = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text !== undefined) n.textContent = text;
    return n;
  };
  const parts = [];
  for (let k = 0; k <= 4; k++) {
    const v = max * k / 4;
    parts.push(node("line", { x1: L, x2: W - 6, y1: y(v), y2: y(v), stroke: "#e6e9ef" }),
      node("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end" }, unit === "s" ? fmt.s(v) : v.toFixed(1)));
  }
  const tick = span > 150 ? 60 : span > 60 ? 30 : 15;
  for (let back = Math.floor(span / tick) * tick; back >= 0; back -= tick) {
    const label = back === 0 ? "now" : back % 60 === 0 ? `-${back / 60} min` : `-${back} s`;
    parts.push(node("text", { x: x(now - back), y: H - 4, "text-anchor": back ? "middle" : "end" }, label));
  }
  for (const l of lines) {
    let d = "";
    let pen = false;
    for (const [t, v] of l.points) {
      if (v === null || t < t0) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
    }
    if (d) parts.push(node("path", { d, fill: "none", stroke: l.color, "stroke-width": 1.8,
      "stroke-dasharray": l.dash ? "5 3" : "none" }));
  }
  svg.replaceChildren(...parts);
  const names = [...new Map(lines.map((l) => [l.name, l.color])).entries()];
  $(legendId).replaceChildren(...names.map(([name, color]) => LF.el("span", {},
    LF.el("i", { style: `background:${color}` }), name)));
  if (!names.length) $(legendId).replaceChildren(LF.el("span", { class: "muted", text: "nothing yet" }));
}

function renderCharts() {
  const p50 = windowQuantiles("stages", 0.5), p99 = windowQuantiles("stages", 0.99);
  const stageLines = [];
  Object.keys(p99).sort().forEach((stage, i) => {
    const color = COLORS[i % COLORS.length];
    stageLines.push({ name: stage, color, points: p50[stage], dash: false },
      { name: stage, color, points: p99[stage], dash: true });
  });
  drawChart("chart-stages", "legend-stages", stageLines, "s");
  const depth = gaugeSeries("queue_depth");
  drawChart("chart-queues", "legend-queues", Object.keys(depth).sort().map((m, i) => ({ name: m,
    color: COLORS[i % COLORS.length], points: depth[m] })), "n");
}

// ---- polling ---------------------------------------------------------------------------------------------------
async function poll() {
  if (paused) return;
  try {
    const snap = await LF.request(`/v1/ops/metrics?scope=${SCOPE}`, {}, ADMIN);
    if (paused) return; // paused while the request was out: keep what is shown
    $("ops-error").textContent = "";
    history.push(snap);
    while (history.length > KEEP) history.shift();
    renderCards(snap.summary);
    renderBreaker(snap.summary);
    renderTables(snap.summary);
    renderCharts();
    $("updated").textContent = "updated " + new Date(snap.time * 1000).toLocaleTimeString();
    document.body.dataset.snapshots = String(Number(document.body.dataset.snapshots || 0) + 1);
  } catch (e) {
    $("ops-error").textContent = `error [${e.code}]: ${e.message}`;
    if (e.status === 401 || e.status === 403) {
      stopPolling();
      await LF.askKey($("key-dialog"), ADMIN, e.message);
      showKeyState();
      startPolling();
    }
  }
}

function startPolling() {
  stopPolling();
  poll();
  timer = setInterval(poll, POLL_MS);
}

function stopPolling() {
  clearInterval(timer);
  timer = null;
}

function showKeyState() {
  $("key-state").textContent = LF.key(ADMIN) ? "admin key set for this tab" : "no admin key";
}

window.addEventListener("DOMContentLoaded", () => {
  showKeyState();
  $("key-change").onclick = async () => {
    stopPolling();
    await LF.askKey($("key-dialog"), ADMIN, "");
    showKeyState();
    startPolling();
  };
  $("pause").onclick = () => {
    paused = !paused;
    $("pause").textContent = paused ? "Resume" : "Pause";
    document.body.dataset.paused = String(paused);
    if (!paused) poll();
  };
  startPolling();
});
