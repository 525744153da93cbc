// servelab lab: controls -> JSON API -> read-outs and charts.
// No number is computed here: the server returns every figure; this file formats and draws.
"use strict";

// The sidebar's controls come from the scenario's field declarations (/api/meta
// "controls": group, key, label, range or options); the model group starts with the presets.
const MODEL_GROUP = "Model (GPU time per batch)";
const SERVING_GROUP = "LLM serving";  // the LLM section's sliders, not the sidebar's

const PRESETS = {
  "seed: BERT-base-class encoder (roofline)": null, // the seed's own values
  "ranking MLP: 0.8 ms + 0.02 ms/row": { "model.kind": "affine", "model.base_ms": 0.8, "model.per_row_ms": 0.02 },
  "vision CNN: 1.5 ms + 0.4 ms/row": { "model.kind": "affine", "model.base_ms": 1.5, "model.per_row_ms": 0.4 },
  "fixed 2 ms per batch": { "model.kind": "constant", "model.latency_ms": 2.0 },
};

let META = null;
let state = {};
let inFlight = false;
let dirty = false;
let last = {};

const $ = (sel) => document.querySelector(sel);
const idOf = (key) => "c-" + key.replace(/[._]/g, "-");

function get(obj, path) {
  return path.split(".").reduce((o, k) => (o == null ? undefined : o[k]), obj);
}

function fmt(v, kind) {
  if (v === undefined || v === null) return "–";
  switch (kind) {
    case "f0": return Number(v).toFixed(0);
    case "f1": return Number(v).toFixed(1);
    case "f2": return Number(v).toFixed(2);
    case "int": return Math.round(v).toLocaleString("en-US");
    case "num": return String(v);
    case "pct": return (100 * v).toFixed(1) + "%";
    case "ms": return Number(v).toFixed(2) + " ms";
    case "usd": return "$" + Number(v).toFixed(3);
    case "bytes": return bytes(v);
    case "range": return Array.isArray(v) && v[0] != null && v[1] != null ? `${Number(v[0]).toFixed(2)}–${Number(v[1]).toFixed(2)} ms` : "–";
    default: return String(v);
  }
}

function bytes(v) {
  if (v >= 2 ** 30) return (v / 2 ** 30).toFixed(3) + " GiB";
  if (v >= 2 ** 20) return (v / 2 ** 20).toFixed(3) + " MiB";
  return Math.round(v).toLocaleString("en-US") + " B";
}

function buildControls() {
  const root = $("#controls");
  for (const grp of META.controls) {
    if (grp.group === SERVING_GROUP) { buildLlmSliders(grp.items); continue; }
    const fs = document.createElement("fieldset");
    fs.innerHTML = `<legend>${grp.group}</legend>`;
    const items = grp.group === MODEL_GROUP ? [{ key: "preset", label: "Preset", preset: true }, ...grp.items] : grp.items;
    for (const c of items) fs.appendChild(buildControl(c));
    root.appendChild(fs);
  }
}

function buildControl(c) {
  const row = document.createElement("div");
  row.className = "control";
  row.dataset.key = c.key;
  if (c.kinds) row.dataset.kinds = c.kinds.join(",");
  const id = idOf(c.key);
  const label = `<label for="${id}">${c.label}</label>`;
  if (c.preset) {
    const opts = Object.keys(PRESETS).map((p) => `<option>${p}</option>`).join("");
    row.innerHTML = `${label}<select id="${id}"><option value="">(choose)</option>${opts}</select>`;
    row.querySelector("select").addEventListener("change", (e) => applyPreset(e.target.value));
    return row;
  }
  const options = c.options || (c.optionsFrom ? META[c.optionsFrom] : null);
  if (options) {
    row.innerHTML = `${label}<select id="${id}">${options.map((o) => `<option value="${o}">${o}</option>`).join("")}</select>`;
    row.querySelector("select").addEventListener("change", (e) =>
      set(c.key, c.numeric ? Number(e.target.value) : e.target.value));
  } else if (c.list) {
    row.innerHTML = `${label}<input id="${id}" type="text" inputmode="numeric" placeholder="none">`;
    row.querySelector("input").addEventListener("change", (e) => {
      const v = e.target.value.split(",").map((x) => x.trim()).filter(Boolean).map(Number);
      set(c.key, v);
    });
  } else if (c.number) {
    row.innerHTML = `${label}<input id="${id}" type="number" step="any">`;
    row.querySelector("input").addEventListener("change", (e) => set(c.key, Number(e.target.value)));
  } else {
    row.innerHTML = `${label}<div class="pair"><input id="${id}-range" type="range" min="${c.min}" max="${c.max}" step="${c.step}" aria-label="${c.label} slider">` +
      `<input id="${id}" type="number" min="${c.min}" step="${c.step}"></div>`;
    const range = row.querySelector('input[type="range"]');
    const num = row.querySelector('input[type="number"]');
    // While a slider moves only the read-outs follow (one request per move); the sweeps
    // behind the charts are redrawn when it is let go.
    // A key press fires input and change in one task: the full run alone answers it.
    // A drag fires input alone until release: a preview answers each move, left to a
    // later task so that a change arriving with the input cancels it.
    range.addEventListener("input", () => {
      num.value = range.value;
      state[c.key] = Number(range.value);
      clearTimeout(previewTimer);
      previewTimer = setTimeout(() => { dragging = true; schedule(false); }, 0);
    });
    range.addEventListener("change", () => {
      clearTimeout(previewTimer);
      dragging = false;
      set(c.key, Number(range.value));
    });
    num.addEventListener("change", () => { range.value = num.value; set(c.key, Number(num.value)); });
  }
  return row;
}

function showControls() {
  for (const row of document.querySelectorAll(".control")) {
    const key = row.dataset.key;
    if (row.dataset.kinds) row.hidden = !row.dataset.kinds.split(",").includes(state["model.kind"]);
    if (key === "preset") continue;
    const v = state[key];
    const id = idOf(key);
    const el = document.getElementById(id);
    if (!el) continue;
    if (Array.isArray(v)) el.value = v.join(",");
    else el.value = v === undefined || v === null ? "" : String(v);
    const range = document.getElementById(id + "-range");
    if (range && v !== undefined && v !== null) range.value = String(v);
  }
}

// The preset whose values the state holds (a link, Reset or a loaded file can bring one
// back), or none.
function showPreset() {
  const sel = document.getElementById(idOf("preset"));
  if (!sel) return;
  let found = "";
  for (const [name, p] of Object.entries(PRESETS)) {
    const want = p === null ? pickModel(META.default_state) : p;
    if (Object.entries(want).every(([k, v]) => JSON.stringify(state[k]) === JSON.stringify(v))) { found = name; break; }
  }
  sel.value = found;
}

// Charts wait for plotly.js (loaded after the first read-outs); the latest figure for
// each chart is kept and drawn when it arrives.
const pendingPlots = new Map();
function plot(id, data, layout, config) {
  if (window.Plotly) Plotly.react(id, data, layout, config);
  else pendingPlots.set(id, [data, layout, config]);
}

let plotlyAsked = false;
let sectionsStarted = false;
function startSections() {  // once the first read-outs have painted: the rest of the page
  if (sectionsStarted) return;
  sectionsStarted = true;
  loadPlotly();
  loadSeedTable();
  llmInit();
  driftInit();
}
function loadPlotly() {  // after the first read-outs: the numbers never wait for the charts
  if (plotlyAsked) return;
  plotlyAsked = true;
  const tag = document.createElement("script");
  tag.src = "/vendor/plotly.min.js";
  tag.async = true;
  tag.onload = () => {
    for (const [id, args] of pendingPlots) Plotly.react(id, ...args);
    pendingPlots.clear();
  };
  tag.onerror = () => showError("charts: plotly.js did not load; the read-outs are unaffected; fix: reload the page");
  document.head.appendChild(tag);
}

function applyPreset(name) {
  if (!(name in PRESETS)) return;
  const p = PRESETS[name];
  if (p === null) {
    for (const k of Object.keys(META.default_state)) if (k.startsWith("model.")) state[k] = META.default_state[k];
  } else Object.assign(state, p);
  showControls();
  schedule();
}

let wantCharts = true;
let dragging = false;  // a slider is moving: read-outs come from a smaller preview run
let previewTimer = null;  // a slider's preview, until a change in the same task cancels it

function set(key, value, charts = true) {
  state[key] = value;
  if (key === "model.kind") showControls();
  schedule(charts);
}

// A full run waits for the one in flight, except a preview's: the full run starts at once
// beside it (a click on a slider previews on the press and is final on the release), and
// the preview's answer, older than the run that overtook it, is dropped.
let runs = 0;  // each refresh's number; only the newest one's answer is shown
let previewRun = 0;  // the number of the preview in flight, 0 when none

function schedule(charts = true) {
  wantCharts = wantCharts || charts;
  if (inFlight && !(previewRun && !dragging)) { dirty = true; return; }
  refresh();
}

async function post(url, body) {
  const r = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  const data = await r.json();
  if (!r.ok) throw Object.assign(new Error(data.error || data.detail || r.statusText), { key: data.key });
  return data;
}

async function refresh() {
  const run = ++runs;
  inFlight = true;
  dirty = false;
  const sent = { ...state };
  const preview = dragging;
  previewRun = preview ? run : 0;
  $("#status").textContent = "computing…";
  try {
    const poolChanged = JSON.stringify(deploymentKey(sent)) !== JSON.stringify(last.poolKey);
    const withCharts = wantCharts || !last.charts;
    wantCharts = false;
    // The read-outs first: the charts' sweeps are asked for once they have arrived (on two
    // cores the two runs side by side slowed the read-outs to the pair's time), and are
    // drawn when theirs arrive.
    const upd = await post("/api/update", { state: sent, preview });
    if (run !== runs) return;  // overtaken by a newer run
    const chartsAsked = withCharts ? post("/api/charts", { state: sent }) : null;
    if (chartsAsked) chartsAsked.catch(() => {});  // awaited below; no unhandled rejection
    last.update = upd;
    // Adopt the server's normalised state (e.g. "h100" -> "H100-SXM") unless the user
    // changed something while this request was in flight.
    // (The LLM section's sliders write the state between updates: theirs are kept.)
    if (!dirty) state = { ...upd.state, ...pickModel(state), ...pickServing(state) };
    if (poolChanged) {  // the paging replay runs in the background: read-outs never wait
      last.poolKey = deploymentKey(sent);
      refreshPaging(sent, last.poolKey);
      // the LLM section serves this deployment; a validated server's fit was of another
      if (LLM.fitted && JSON.stringify(last.poolKey) !== LLM.fitKey) removeLlmValidation(false);
      if (sectionsStarted) llmSoon();
    }
    clearError();
    $("#results").dataset.preview = upd.preview ? "1" : "";
    renderReadouts();
    renderNotes(allNotes());
    writeUrl();
    showPreset();
    document.body.dataset.ready = "1";
    if (!sectionsStarted) requestAnimationFrame(() => setTimeout(startSections, 0));
    if (chartsAsked) {
      const charts = await chartsAsked;
      if (run !== runs) return;
      last.charts = charts;
    }
    drawLater();
    $("#status").textContent = "";
  } catch (err) {
    if (run !== runs) return;
    showError(err.message);
    $("#status").textContent = "";
    $("#results").dataset.stale = "1";  // the read-outs are from the last good state
  } finally {
    if (run === runs) {
      inFlight = false;
      previewRun = 0;
      if (dirty) refresh();
    }
  }
}

function pagingSettings() {
  const n = (id) => Math.round(Number($(id).value) || 0);
  return { requests: n("#paging-requests"), max_len: n("#paging-max-len"), prefix_tokens: n("#paging-prefix") };
}

// The replay takes seconds: it starts once the KV inputs have rested for a moment, one at a
// time, and the read-outs never wait for it.
let pagingWanted = null;  // the pool key of the latest paging request
let pagingTimer = null;
let pagingBusy = false;
// While a replay runs, or when the new settings failed, the card says its figures are the
// previous settings' (faded, with a line on the card). state: "running", "failed" or "".
const PAGING_CARD = { running: "· replaying for the new settings…", failed: "· the previous settings' (the new ones failed)" };
function pagingPending(state) {
  const stale = state !== "" && Boolean(last.paging);
  $("#card-paging").dataset.pending = stale ? "1" : "";
  $("#paging-card-status").textContent = stale ? PAGING_CARD[state] : (state === "running" ? "· replaying…" : "");
  $("#paging-status").textContent = state === "running" ? "(replaying allocations…)" : "";
}

function refreshPaging(sent, key) {
  pagingWanted = key;
  pagingPending("running");
  clearTimeout(pagingTimer);
  pagingTimer = setTimeout(() => runPaging(sent, key), last.paging ? 400 : 0);
}

async function runPaging(sent, key) {
  if (pagingBusy) { pagingTimer = setTimeout(() => runPaging(sent, key), 200); return; }
  if (pagingWanted !== key) return;
  pagingBusy = true;
  try {
    const paging = await post("/api/paging", { state: sent, ...pagingSettings() });
    if (pagingWanted !== key) return;  // a newer pool was asked for meanwhile
    last.paging = paging;
    pagingPending("");
    renderReadouts();
    renderNotes(allNotes());
    drawLater();
  } catch (err) {
    if (pagingWanted !== key) return;
    pagingPending("failed");
    showError(err.message);
  } finally {
    pagingBusy = false;
  }
}

function loadSeedTable() {  // once: the seed scenario's table does not move with the page
  fetch("/api/seed").then((r) => r.json()).then((d) => {
    const body = $("#seed-table tbody");
    body.replaceChildren(...d.rows.map((r) => {
      const tr = document.createElement("tr");
      for (const v of [r.figure, r.stated, r.servelab, r.agrees ? "yes" : "no", r.reason]) {
        const td = document.createElement("td");
        td.textContent = v;
        tr.appendChild(td);
      }
      tr.className = r.agrees ? "agrees" : "differs";
      return tr;
    }));
  }).catch(() => {});
}

function showError(message) {
  $("#error").textContent = message;
  $("#error").hidden = false;
  for (const row of document.querySelectorAll(".control.bad")) row.classList.remove("bad");
  // "[section] key = value: ..." names a scenario key: mark its control
  const m = /\[(\w+)\] (\w+)/.exec(message);
  const row = m && document.querySelector(`.control[data-key="${m[1]}.${m[2]}"]`);
  if (row) {
    row.classList.add("bad");
    for (const el of row.querySelectorAll("input, select")) el.setAttribute("aria-invalid", "true");
  }
}

function clearError() {
  $("#error").hidden = true;
  $("#results").dataset.stale = "";
  for (const row of document.querySelectorAll(".control.bad")) {
    row.classList.remove("bad");
    for (const el of row.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  }
}

function pick(obj, prefix, extra) {
  const out = {};
  for (const k of Object.keys(obj).sort()) if (k.startsWith(prefix) || k === extra) out[k] = obj[k];
  return out;
}

function pickServing(obj) {  // the LLM section's own keys
  const out = {};
  for (const k of Object.keys(obj)) if (SERVING_KEYS.has(k)) out[k] = obj[k];
  return out;
}

function pickModel(obj) {  // keep the fields of other service-time kinds while the user switches
  const out = {};
  for (const k of Object.keys(obj)) if (k.startsWith("model.")) out[k] = obj[k];
  return out;
}

// Read-outs first, in the same task as the answer; the charts on a later frame, after the
// numbers have painted, and only those whose data changed.
function allNotes() {
  return [...(last.update.notes || []), ...((last.paging && last.paging.notes) || [])];
}

let renders = 0;
function renderReadouts() {
  const data = { ...last.update, paging: last.paging ? last.paging.summary : {} };
  $("#results").dataset.rendered = String(++renders);  // tests time moves by this
  for (const el of document.querySelectorAll("output[data-path]")) {
    const v = get(data, el.dataset.path);
    const value = v === undefined ? "" : JSON.stringify(v);
    if (el.dataset.value === value && el.textContent) continue;
    el.dataset.value = value;
    el.textContent = fmt(v, el.dataset.fmt);
  }
  const plan = last.update.plan;
  const gpus = $("#out-gpus");
  if (plan && plan.meets_slo === false) {  // the search hit its ceiling: say it, not a bare count
    gpus.textContent = `${fmt(plan.num_gpus, "int")}: SLO not met`;
    gpus.classList.add("miss");
  } else gpus.classList.remove("miss");
  const g = last.update.kv && last.update.kv.memory.per_gpu;
  $("#out-vram-headroom").textContent = g
    ? `KV pool ${(g.kv_pool_bytes / 2 ** 30).toFixed(1)} GiB, left by utilization ${(g.unused_bytes / 2 ** 30).toFixed(1)} GiB per GPU`
    : "";
}

let drawPending = false;
function drawLater() {
  if (drawPending || !last.update || !last.charts) return;  // the first charts not here yet
  drawPending = true;
  // a frame for the read-outs to paint, then the charts in a task of their own
  requestAnimationFrame(() => setTimeout(() => { drawPending = false; drawCharts(); }, 0));
}

function renderNotes(notes) {  // warnings the CLI prints (overload, caps, timeouts), as text
  const box = $("#notes");
  box.replaceChildren(...notes.map((n) => { const li = document.createElement("li"); li.textContent = n; return li; }));
  box.hidden = notes.length === 0;
}

const LAYOUT = { margin: { l: 60, r: 60, t: 10, b: 50 }, height: 290, font: { size: 12 },
  paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", legend: { orientation: "h", y: -0.32, yanchor: "top" } };
const CONFIG = { displayModeBar: false, responsive: true };

// What each chart was last drawn from: a chart whose inputs are the same objects is not
// redrawn (Plotly.react on six charts costs more than the read-outs themselves).
const drawn = {};
function changed(name, ...inputs) {
  const prev = drawn[name];
  if (prev && prev.length === inputs.length && prev.every((x, i) => x === inputs[i])) return false;
  drawn[name] = inputs;
  return true;
}

function drawCharts() {
  const sim = last.update.simulate;
  const c = sim.latency.components;
  if (changed("budget", sim)) {
  const parts = [["frontend", "front end", "#c2987a"], ["feature_fetch", "feature fetch", "#7aa6c2"], ["queue", "queue", "#f2b134"], ["gpu", "GPU", "#6cae75"], ["network", "network", "#a57fc0"]];
  plot("chart-budget", [
    ...parts.map(([k, name, color]) => ({ type: "bar", orientation: "h", name, y: ["mean"], x: [c[k].mean_ms], marker: { color } })),
    { type: "scatter", mode: "markers", name: "p50", y: ["mean"], x: [sim.latency.p50_ms], marker: { symbol: "line-ns-open", size: 24, color: "#333" } },
    { type: "scatter", mode: "markers", name: "p99", y: ["mean"], x: [sim.latency.p99_ms], marker: { symbol: "line-ns-open", size: 24, color: "#c0392b" } },
  ], { ...LAYOUT, barmode: "stack", xaxis: { title: { text: "latency (ms)" } } }, CONFIG);
  const hist = sim.batching.batch_size_histogram;
  plot("chart-hist", [{ type: "bar", x: Object.keys(hist).map(Number), y: Object.values(hist), marker: { color: "#6cae75" } }],
    { ...LAYOUT, xaxis: { title: { text: "rows per batch" } }, yaxis: { title: { text: "batches" } } }, CONFIG);
  }
  const w = last.charts.window_sweep;
  // The sweeps run fewer requests per point than the cards: say so beside them.
  const n = last.charts.requests_per_point;
  for (const el of document.querySelectorAll(".chart-n")) el.textContent = `(each point ${fmt(n, "int")} simulated requests; the cards above ${fmt(last.update.simulate.requests.arrivals, "int")})`;
  const now = last.update.state;  // the operating point: the state these charts are for
  if (changed("window", w, now["batching.max_queue_delay_microseconds"])) plot("chart-window", [
    { name: "p50 ms", x: w.map((r) => r.max_queue_delay_us / 1000), y: w.map((r) => r.p50_ms), mode: "lines+markers" },
    { name: "p99 ms", x: w.map((r) => r.max_queue_delay_us / 1000), y: w.map((r) => r.p99_ms), mode: "lines+markers" },
    { name: "throughput capacity (req/s)", x: w.map((r) => r.max_queue_delay_us / 1000), y: w.map((r) => r.capacity_per_s), yaxis: "y2", mode: "lines", line: { dash: "dot" } },
  ], { ...LAYOUT, xaxis: { title: { text: "batch window (ms)" } }, yaxis: { title: { text: "ms" }, rangemode: "tozero" }, yaxis2: { title: { text: "req/s" }, overlaying: "y", side: "right", rangemode: "tozero" },
    ...operatingPoint(now["batching.max_queue_delay_microseconds"] / 1000) }, CONFIG);
  const q = last.charts.qps_sweep;
  const v = last.validation;
  if (changed("qps", q, v, v && v.fitted, now["workload.qps"])) plot("chart-qps", [
    { name: "GPU busy", x: q.map((r) => r.qps), y: q.map((r) => r.busy_fraction), mode: "lines+markers" },
    { name: "p99 ms", x: q.map((r) => r.qps), y: q.map((r) => r.p99_ms), yaxis: "y2", mode: "lines+markers" },
    ...(v ? [
      { name: "validate: measured p99", x: v.rate, y: v.measured, yaxis: "y2", mode: "markers", marker: { symbol: "x", size: 10, color: "#222" } },
      { name: "validate: predicted p99", x: v.rate, y: v.predicted, yaxis: "y2", mode: "lines", line: { dash: "dash", color: "#c0392b" } },
    ] : []),
    ...(v && v.fitted ? [
      { name: "validate's fitted scenario: p99", x: v.fitted.map((r) => r.qps), y: v.fitted.map((r) => r.p99_ms), yaxis: "y2", mode: "lines", line: { dash: "dot", color: "#222" } },
    ] : []),
  ], { ...LAYOUT, xaxis: { title: { text: "offered load (requests/s)" } }, yaxis: { title: { text: "GPU busy" }, tickformat: ".0%", range: [0, 1.05] }, yaxis2: { title: { text: "p99 ms" }, overlaying: "y", side: "right", rangemode: "tozero" },
    ...operatingPoint(now["workload.qps"]) }, CONFIG);
  const kv = last.update.kv;
  if (kv && changed("vram", JSON.stringify(kv.memory.per_gpu))) {
    const g = kv.memory.per_gpu;
    const segs = [["weights_bytes", "weights", "#8e8e8e"], ["activation_bytes", "activation", "#f2b134"], ["non_torch_bytes", "non-torch", "#d98880"],
      ["cudagraph_bytes", "CUDA graphs", "#a57fc0"], ["kv_pool_bytes", "KV pool", "#6cae75"], ["unused_bytes", "left by utilization", "#d5dbdb"]];
    plot("chart-vram", segs.map(([k, name, color]) => ({ type: "bar", orientation: "h", name, y: ["GPU"], x: [g[k] / 2 ** 30], marker: { color } })),
      { ...LAYOUT, barmode: "stack", xaxis: { title: { text: "GiB" } } }, CONFIG);
  }
  if (last.paging && changed("paging", last.paging)) {
    const res = last.paging.results;
    const kinds = [["token", "token states", "#6cae75"], ["reserved", "reserved", "#f2b134"], ["internal", "internal frag.", "#d98880"], ["external", "external frag.", "#a57fc0"], ["free", "free", "#d5dbdb"]];
    plot("chart-paging", kinds.map(([k, name, color]) => ({ type: "bar", name, x: res.map((r) => r.strategy.replace("contiguous_", "contig. ")), y: res.map((r) => r.under_load[k]), marker: { color } })),
      { ...LAYOUT, barmode: "stack", yaxis: { title: { text: "share of the KV pool" }, tickformat: ".0%", range: [0, 1] } }, CONFIG);
  }
}

// A sweep's operating point: a dotted line at the value the page is set to, labelled.
function operatingPoint(x) {
  return {
    shapes: [{ type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1, line: { dash: "dot", color: "#555", width: 1 } }],
    annotations: [{ xref: "x", yref: "paper", x, y: 1, yanchor: "bottom", text: "now", showarrow: false, font: { size: 10, color: "#555" } }],
  };
}

// A validation report (servelab validate --out DIR, DIR/validation.json), read in the page:
// its predicted and measured p99 against the offered rate, over the QPS chart.
function readValidation(text) {
  let report;
  try { report = JSON.parse(text); } catch { throw new Error("validation file: not JSON; fix: load the validation.json that servelab validate --out wrote"); }
  const rows = report && Array.isArray(report.rates) ? report.rates : null;
  const ok = rows && rows.length > 0 && rows.every((r) => r && typeof r.rate_per_s === "number"
    && r.compare && r.compare.p99_ms && "measured" in r.compare.p99_ms && "predicted" in r.compare.p99_ms);
  if (!ok) throw new Error("validation file: no rates with predicted and measured p99; fix: load the validation.json that servelab validate --out wrote");
  const num = (x) => (typeof x === "number" && Number.isFinite(x) ? x : null);
  const measured = rows.map((r) => num(r.compare.p99_ms.measured));
  const predicted = rows.map((r) => num(r.compare.p99_ms.predicted));
  return {
    rate: rows.map((r) => r.rate_per_s),
    measured, predicted,
    label: `${String(report.model || "model").slice(0, 60)} at ${String(report.url || "?").slice(0, 80)}: ${report.within_tolerance ? "within" : "outside"} tolerance`,
    errors: `p99 predicted vs measured: ${rows.map((r, i) => `${fmt(r.rate_per_s, "int")}/s ${pctError(predicted[i], measured[i])}`).join(", ")}`,
    // the scenario validate fitted (page state), its sweep drawn under the measurement
    fitState: report.fit_state && typeof report.fit_state === "object" && !Array.isArray(report.fit_state) ? report.fit_state : null,
    fitted: null,
  };
}

// The fitted scenario's p99 against the rate, around the validation's middle rate (the
// server simulates it, as every other chart, within the lab's limits).
async function sweepFitted(v) {
  if (!v.fitState) return;
  const rates = v.rate.filter((r) => r > 0).sort((a, b) => a - b);
  const mid = rates[Math.floor(rates.length / 2)];
  const charts = await post("/api/charts", { state: { ...v.fitState, "workload.qps": mid } });
  if (last.validation !== v) return;  // removed or replaced meanwhile
  v.fitted = charts.qps_sweep;
  if (last.update && last.charts) drawCharts();
}

// "+5%" for predicted against measured, "n/a" without both
function pctError(predicted, measured) {
  if (predicted == null || measured == null || measured === 0) return "n/a";
  const e = (predicted - measured) / measured * 100;
  return `${e >= 0 ? "+" : ""}${e.toFixed(0)}%`;
}

// A loaded validation's overlay is shown with its per-rate errors and a button to remove
// it; Reset removes it too.
function showValidation() {
  const v = last.validation;
  $("#out-validation").textContent = v ? ` · validation of ${v.label}; ${v.errors}` : "";
  $("#btn-validation-remove").hidden = !v;
}

function removeValidation() {
  last.validation = null;
  showValidation();
  if (last.update && last.charts) drawCharts();
}

// The drift section's controls are in the link too, as "drift.ID" (the element ids
// without their prefix), where they differ from the page's defaults; a link restores
// them before the section's first run. (The LLM section's are [llm] keys of the state.)
const SECTION_CONTROLS = { drift: "#drift-controls", paging: "#paging-settings" };
const SECTION_PREFIX = { drift: "drift-", paging: "paging-" };
let sectionUrl = {};  // what the link gave, until each section has applied it

function sectionElements(section) {
  const at = SECTION_CONTROLS[section];
  return [...document.querySelectorAll(`${at} select, ${at} input[type=range], ${at} input[type=number]`)];
}

function sectionParams() {
  const out = {};
  for (const section of Object.keys(SECTION_CONTROLS)) {
    for (const el of sectionElements(section)) {
      const def = el.dataset.default;
      if (def !== undefined && el.value !== def) out[`${section}.${el.id.slice(SECTION_PREFIX[section].length)}`] = el.value;
    }
  }
  return out;
}

// A section's defaults (taken once, when its options exist), then the link's values.
function applySectionUrl(section) {
  for (const el of sectionElements(section)) {
    if (el.dataset.default === undefined) el.dataset.default = el.value;
    const v = sectionUrl[`${section}.${el.id.slice(SECTION_PREFIX[section].length)}`];
    if (v === undefined) continue;
    setControl(el, v);
  }
}

// A section control's value, shown beside it too (an <output> "-v" or a typed box "-n").
function setControl(el, value) {
  el.value = String(value);
  const shown = document.getElementById(`${el.id}-v`) || document.getElementById(`${el.id}-n`);
  if (!shown) return;
  if (shown.tagName === "INPUT") shown.value = el.value; else shown.textContent = el.value;
}

function resetSection(section) {
  for (const el of sectionElements(section)) {
    if (el.dataset.default !== undefined) setControl(el, el.dataset.default);
  }
}

// Export/Load TOML keep the sections as [lab.drift] and [lab.paging] (their keys are
// /api/drift's and /api/paging's): the controls that differ from the page's defaults, as in
// the link.
const LAB_TOML = {
  drift: { feature: "feature", shift: "mean_shift", spread: "spread", missing: "missing",
    new: "new_category", rows: "rows" },
  paging: { requests: "requests", "max-len": "max_len", prefix: "prefix_tokens" },
};

function labToml() {
  const tables = {};
  for (const [k, v] of Object.entries(sectionParams())) {
    const [section, id] = [k.split(".")[0], k.slice(k.indexOf(".") + 1)];
    const key = (LAB_TOML[section] || {})[id];
    if (!key) continue;
    (tables[section] ||= []).push(`${key} = ${id === "feature" ? JSON.stringify(v) : Number(v)}`);
  }
  return Object.entries(tables).map(([t, lines]) => `\n[lab.${t}]\n${lines.join("\n")}\n`).join("");
}

// A loaded file's [lab] tables: every section back to its defaults, then the file's values.
function applyLab(lab) {
  sectionUrl = {};
  for (const [section, keys] of Object.entries(LAB_TOML)) {
    const given = (lab && lab[section]) || {};
    for (const [id, key] of Object.entries(keys)) {
      if (key in given) sectionUrl[`${section}.${id}`] = String(given[key]);
    }
  }
  resetSection("paging");
  applySectionUrl("paging");
  if (last.poolKey) refreshPaging({ ...state }, {});
  if (!DRIFT.meta) return;  // the drift section applies sectionUrl when it starts
  resetSection("drift");
  applySectionUrl("drift");
  driftKindControls();
  driftRefresh();
}

function writeUrl() {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(state)) {
    if (JSON.stringify(v) !== JSON.stringify(META.default_state[k])) params.set(k, JSON.stringify(v));
  }
  for (const [k, v] of Object.entries(sectionParams())) params.set(k, v);
  const qs = params.toString();
  history.replaceState(null, "", qs ? "?" + qs : location.pathname);
}

function readUrl() {
  const s = { ...META.default_state };
  sectionUrl = {};
  for (const [k, v] of new URLSearchParams(location.search)) {
    if (k.split(".")[0] in SECTION_CONTROLS) { sectionUrl[k] = v; continue; }
    if (k.startsWith("serve.")) continue;  // an older link's LLM section: now [llm] keys
    try { s[k] = JSON.parse(v); } catch { s[k] = v; }
  }
  return s;
}

function download(name, text) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(new Blob([text], { type: "application/toml" }));
  a.download = name;
  a.click();
  URL.revokeObjectURL(a.href);
}

async function init() {
  META = await (await fetch("/api/meta")).json();
  buildControls();
  llmFlags();
  state = readUrl();
  applySectionUrl("paging");  // before the first update, which starts the replay
  showControls();
  showPreset();
  $("#btn-export").addEventListener("click", () => download("scenario.toml", last.update.toml + labToml()));
  $("#btn-link").addEventListener("click", async () => {
    try { await navigator.clipboard.writeText(location.href); $("#status").textContent = "link copied"; }
    catch { $("#status").textContent = location.href; }
  });
  $("#btn-load").addEventListener("click", () => $("#file-load").click());
  for (const id of ["#paging-requests", "#paging-max-len", "#paging-prefix"]) {
    $(id).addEventListener("change", () => {
      writeUrl();
      if (last.poolKey) refreshPaging({ ...state }, {});
    });
  }
  $("#btn-validation").addEventListener("click", () => $("#file-validation").click());
  $("#file-validation").addEventListener("change", async (e) => {
    const file = e.target.files[0];
    if (!file) return;
    e.target.value = "";
    try {
      if (file.size > 4 * 1024 * 1024) throw new Error("validation file: over 4 MiB; fix: load the validation.json that servelab validate --out wrote");
      last.validation = readValidation(await file.text());
      showValidation();
      clearError();
      if (last.update && last.charts) drawCharts();
      await sweepFitted(last.validation);
    } catch (err) { showError(err.message); }
  });
  $("#btn-validation-remove").addEventListener("click", removeValidation);
  $("#btn-llm-validation-remove").addEventListener("click", () => removeLlmValidation());
  $("#btn-reset").addEventListener("click", () => {
    state = { ...META.default_state };
    removeValidation();
    removeLlmValidation(false);  // one LLM run below, on the reset state
    resetSection("drift");
    resetSection("paging");
    if (last.poolKey) refreshPaging({ ...state }, {});
    showLlmControls();
    llmRefresh();
    if (DRIFT.meta) { driftKindControls(); driftRefresh(); }
    showControls(); showPreset(); schedule();
  });
  $("#file-load").addEventListener("change", async (e) => {
    const file = e.target.files[0];
    if (!file) return;
    e.target.value = "";  // so choosing the same file again loads it again
    try {
      const parsed = await post("/api/parse", { toml: await file.text() });
      state = parsed.state;
      applyLab(parsed.lab);
      showControls();
      showLlmControls();
      schedule();
      if (sectionsStarted) llmSoon();
    } catch (err) { showError(err.message); }
  });
  refresh();
}

// -- Features and drift ------------------------------------------------------------------
const DRIFT = { inFlight: false, dirty: false, meta: null };
const DRIFT_SLIDERS = ["shift", "spread", "missing", "new", "rows"];

function driftQuery() {
  const v = (id) => Number($(`#drift-${id}`).value);
  return { feature: $("#drift-feature").value, mean_shift: v("shift"), spread: v("spread"),
    missing: v("missing"), new_category: v("new"), rows: v("rows") };
}

function driftKindControls() {
  const f = DRIFT.meta.features.find((x) => x.name === $("#drift-feature").value);
  const categorical = f && f.kind === "categorical";
  $("#drift-shift").disabled = categorical;
  $("#drift-spread").disabled = categorical;
  $("#drift-new").disabled = !categorical;
}

async function driftRefresh() {
  if (DRIFT.inFlight) { DRIFT.dirty = true; return; }
  DRIFT.inFlight = true;
  DRIFT.dirty = false;
  try {
    const d = await post("/api/drift", driftQuery());
    $("#out-psi").textContent = d.psi.toFixed(4);
    $("#out-psi").dataset.value = String(d.psi);
    $("#out-psi-chance").textContent = d.chance_psi_p99.toFixed(4);
    $("#out-drift-status").textContent = d.status;
    $("#out-drift-status").dataset.status = d.status;
    $("#out-drift-why").textContent = d.significant
      ? `above chance (${d.n_current.toLocaleString()} rows vs ${d.n_reference.toLocaleString()})`
      : `within chance for ${d.n_current.toLocaleString()} rows: not significant`;
    const p = d.parity;
    const bad = Object.values(p.mismatches).reduce((a, b) => a + b, 0);
    $("#out-parity").textContent = p.ok ? "identical" : `${bad} mismatches`;
    $("#out-parity-detail").textContent = `${p.rows_checked} entity rows × ${Object.keys(p.mismatches).length} features, online vs offline point-in-time at ${p.at.slice(0, 16)}`;
    plot("chart-drift", [
      { type: "bar", name: "reference", x: d.bins, y: d.reference_share, marker: { color: "#888" } },
      { type: "bar", name: "current", x: d.bins, y: d.current_share, marker: { color: "#1f77b4" } },
    ], { ...LAYOUT, barmode: "group", yaxis: { title: { text: "share of rows" }, tickformat: ".0%" },
      xaxis: { title: { text: `${d.feature} bin` }, automargin: true } }, CONFIG);
    document.body.dataset.driftReady = "1";
    if (document.body.dataset.ready === "1") writeUrl();
  } catch (err) {
    showError(err.message);
  } finally {
    DRIFT.inFlight = false;
    if (DRIFT.dirty) driftRefresh();
  }
}

async function driftInit() {
  try {
    DRIFT.meta = await (await fetch("/api/drift/meta")).json();
  } catch (err) { showError(String(err)); return; }
  const sel = $("#drift-feature");
  sel.replaceChildren(...DRIFT.meta.features.map((f) => {
    const o = document.createElement("option"); o.value = f.name; o.textContent = `${f.name} (${f.kind})`; return o;
  }));
  sel.value = "avg_amount_7d";
  applySectionUrl("drift");
  sel.addEventListener("change", () => { driftKindControls(); driftRefresh(); });
  for (const id of DRIFT_SLIDERS) {
    $(`#drift-${id}`).addEventListener("input", (e) => {
      $(`#drift-${id}-v`).textContent = e.target.value;
      driftRefresh();
    });
  }
  driftKindControls();
  driftRefresh();
}

// -- LLM serving --------------------------------------------------------------------------
// The page has one LLM deployment: the sidebar's [llm] pool (model, GPU, dtypes, context,
// GPUs in replicas of tp). This section serves it: its sliders are [llm] keys of the same
// state (in the link and the exported TOML), and /api/llm runs `llm simulate --scenario`
// of that state.
// dirty: null (nothing waiting), "preview" or "full" (a full run wins over a preview)
const LLM = { inFlight: false, dirty: null, fitted: null, measured: null, fitKey: null, last: null,
  sweep: null, runs: 0 };
// The section's sliders, from the declarations (/api/meta "controls", group "LLM serving"):
// the element id's suffix (the [llm] key) -> the state key.
const LLM_SLIDERS = {};
const SERVING_KEYS = new Set();

function buildLlmSliders(items) {
  const before = $("#llm-controls").firstElementChild;  // the validation button's span
  for (const c of items) {
    const id = c.key.replace(/^llm\./, "");
    LLM_SLIDERS[id] = c.key;
    SERVING_KEYS.add(c.key);
    const attrs = `min="${c.min}" max="${c.max}" step="${c.step}"`;
    const label = document.createElement("label");
    label.innerHTML = `${c.label} <span><input id="llm-${id}" data-key="${c.key}" type="range" ${attrs}>` +
      `<input id="llm-${id}-n" type="number" ${attrs} aria-label="${id} value"></span>`;
    $("#llm-controls").insertBefore(label, before);
  }
}

function llmQuery() {
  const q = { state: { ...state } };
  if (LLM.fitted) q.fitted = LLM.fitted;
  return q;
}

// The deployment's keys (what the KV pool, its paging replay and serving's deployment
// depend on): [llm] but the serving section's own keys, and the sidebar's GPU.
function deploymentKey(s) {
  const out = pick(s, "llm.", "hardware.gpu");
  for (const k of SERVING_KEYS) delete out[k];
  delete out["llm.replicas"];
  return out;
}

// The section's sliders show the state's values; a key the state leaves unset (vLLM's
// per-GPU defaults for max_num_seqs and max_num_batched_tokens) shows what the last run used.
function showLlmControls() {
  for (const [id, key] of Object.entries(LLM_SLIDERS)) {
    let v = state[key];
    if (v === undefined || v === null) v = LLM.last ? LLM.last[id] : undefined;
    if (v !== undefined && v !== null) setControl($(`#llm-${id}`), v);
  }
}

// An LLM validation report (servelab llm validate --out DIR, DIR/validation.json), read in
// the page: the server's fitted step model and limits drive the section's simulator (the
// server computes every figure), and its measured p99s are drawn over the rate chart.
function readLlmValidation(text) {
  const fail = (why) => new Error(`LLM validation file: ${why}; fix: load the validation.json that servelab llm validate --out wrote`);
  let r;
  try { r = JSON.parse(text); } catch { throw fail("not JSON"); }
  const num = (x) => (typeof x === "number" && Number.isFinite(x) ? x : null);
  const sm = r && r.profile && r.profile.step_model;
  const lim = r && r.limits;
  if (!sm || !lim || !Array.isArray(r.rates) || !r.rates.length) throw fail("no profile, limits and rates");
  const terms = ["base_ms", "per_prefill_token_ms", "per_decode_seq_ms", "per_kv_token_ms"];
  if (!terms.every((k) => num(sm[k]) !== null) || num(lim.slots) === null || num(lim.num_blocks) === null) throw fail("a step model or limit is missing");
  const figure = (rate, name) => { const f = (rate.figures || []).find((g) => g && g.name === name); return f ? num(f.measured) : null; };
  const w = r.workload || {};
  return {
    fit: { ...Object.fromEntries(terms.map((k) => [k, sm[k]])), multi_token_ms: num(sm.multi_token_ms) || 0, overhead_ms: num(r.profile.overhead_ms) || 0,
      num_blocks: lim.num_blocks, label: String(r.endpoint || "").slice(0, 200),
      rule: lim.rule === "llama.cpp" ? "llama.cpp" : "vllm-v1", ctx_per_slot: num(lim.ctx_per_slot) },
    slots: lim.slots, batched: num(lim.max_num_batched_tokens) || 2048,
    prompt: num(w.mean_prompt_tokens) || num(w.input_tokens) || 512, output: num(w.mean_output_tokens) || num(w.output_tokens) || 256,
    rate: r.rates.map((x) => num(x.offered_per_s)),
    ttft: r.rates.map((x) => figure(x, "TTFT p99 (ms)")),
    tpot: r.rates.map((x) => figure(x, "TPOT p99 (ms)")),
    label: `${String(r.model || "model").slice(0, 60)}: ${String(r.verdict || "").slice(0, 60)}`,
    errors: `p99 predicted vs measured: ${r.rates.map((x) => {
      const f = (name) => (x.figures || []).find((g) => g && g.name === name) || {};
      const t = f("TTFT p99 (ms)"), p = f("TPOT p99 (ms)");
      return `${(num(x.offered_per_s) || 0).toFixed(2)}/s TTFT ${pctError(num(t.predicted), num(t.measured))} TPOT ${pctError(num(p.predicted), num(p.measured))}`;
    }).join(", ")}`,
  };
}

function removeLlmValidation(refresh = true) {
  const had = refresh && (LLM.fitted || LLM.measured);
  LLM.fitted = null; LLM.measured = null;
  $("#out-llm-validation").textContent = "";
  $("#btn-llm-validation-remove").hidden = true;
  if (had) llmRefresh();
}

function setSlider(id, value) {  // a section slider and its state key, within its range
  const el = $(`#llm-${id}`);
  const step = Number(el.step) || 1;
  setControl(el, Math.min(Number(el.max), Math.max(Number(el.min), Math.round(value / step) * step)));
  state[LLM_SLIDERS[id]] = Number(el.value);
}

// The simulator's messages name CLI flags or [llm] keys; the section says them in the
// page's words, marks the control they are about (here or in the sidebar's LLM pool),
// and clears both once a run succeeds.
// [flag or key, the control's selector, the page's words]: each [llm] control's flags and
// TOML key, from the declarations (/api/meta "controls"), and a few the simulator says
// of the pool as a whole.
const LLM_CONTROL_OF = {};  // an [llm] key -> its control's selector
const LLM_FLAGS = [
  ["--replicas", "#c-llm-num-gpus", "Replicas (GPUs / tensor parallel × pipeline stages)"], ["--gpu", "#c-hardware-gpu", "GPU"],
];

function llmFlags() {  // once META is read
  for (const grp of META.controls) {
    for (const c of grp.items) {
      if (!c.key.startsWith("llm.")) continue;
      const name = c.key.slice(4);
      const sel = grp.group === SERVING_GROUP ? `#llm-${name}` : `#${idOf(c.key)}`;
      LLM_CONTROL_OF[c.key] = sel;
      const words = c.label.replace(/ \(.*\)$/, "");  // "Tensor parallel (0: all GPUs)"
      const flags = (c.flags || []).filter((f) => f.startsWith("--"));  // not -tp: in --tp
      for (const flag of [...flags, `[llm] ${name}`]) LLM_FLAGS.push([flag, sel, words]);
    }
  }
}
const escapeRe = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

function llmMarked() {
  return document.querySelectorAll("#llm-controls [aria-invalid], #controls [data-llm-invalid]");
}

function llmUnmark() {
  for (const el of llmMarked()) { el.removeAttribute("aria-invalid"); delete el.dataset.llmInvalid; }
}

// `key`: the scenario key the server's error carries, when it knows one (the control is
// then that key's); else the first flag or [llm] key the message names.
function llmError(message, key) {
  let text = message;
  let field = key && key in LLM_CONTROL_OF ? LLM_CONTROL_OF[key] : null;
  for (const [flag, sel, words] of LLM_FLAGS) {
    const re = new RegExp(`${escapeRe(flag)}(?![\\w-])`, "g");
    if (re.test(text)) {
      text = text.replace(re, words);
      if (field === null) field = sel;
    }
  }
  if (field === null && /^KV pool/.test(message)) field = "#c-llm-num-gpus";  // more GPUs fix it
  llmUnmark();
  const el = field && $(field);
  if (el) { el.setAttribute("aria-invalid", "true"); el.dataset.llmInvalid = "1"; }
  $("#llm-error").textContent = text;
  $("#llm-error").hidden = false;
}

function llmClearError() {
  $("#llm-error").hidden = true;
  llmUnmark();
}

// preview: while a slider moves, a smaller run for the read-outs (faded, the charts kept);
// the full run follows on release. The section says what it is waiting for.
async function llmRefresh(preview = false) {
  clearTimeout(LLM.soonTimer);
  clearTimeout(LLM.sweepTimer);
  if (LLM.inFlight) {
    LLM.dirty = LLM.dirty === "full" || !preview ? "full" : "preview";
    return;
  }
  LLM.inFlight = true;
  LLM.dirty = null;
  $("#llm-status").textContent = preview ? "previewing…" : "computing…";
  try {
    const query = llmQuery();
    const d = await post("/api/llm", { ...query, preview });
    llmClearError();
    LLM.last = d;
    showLlmControls();
    $("#llm-deployment").textContent = `Deployment (the sidebar's LLM pool): ${d.model} on ${d.replicas} × ${d.tp}${d.pp > 1 ? ` × ${d.pp} stages` : ""} ${d.gpu}` +
      `, ${d.num_blocks_per_replica.toLocaleString()} KV blocks a replica` + (LLM.fitted ? "; a validated server's fitted step model" : "");
    $("#llm-cards").dataset.preview = d.preview ? "1" : "";
    $("#llm-status").textContent = d.preview ? `preview of ${d.requests_simulated.toLocaleString()} requests; the full run follows on release` : "";
    const ms = (v) => (v == null ? "n/a" : v.toFixed(1));
    $("#out-llm-ttft").textContent = `${ms(d.ttft_ms.p50)} / ${ms(d.ttft_ms.p99)} ms`;
    $("#out-llm-ttft").dataset.value = JSON.stringify(d.ttft_ms.p99);
    $("#out-llm-tpot").textContent = `${ms(d.tpot_ms.p50)} / ${ms(d.tpot_ms.p99)} ms`;
    $("#out-llm-tps").textContent = Math.round(d.output_tokens_per_s).toLocaleString();
    $("#out-llm-running").textContent = `mean running batch ${d.mean_running.toFixed(1)}; ${d.requests.preempted} preempted, ${d.requests.rejected} rejected`;
    const cost = d.cost_per_million_output_usd;
    $("#out-llm-cost").textContent = `${d.gpus} · ${cost == null ? "n/a" : "$" + cost.toFixed(2)}`;
    $("#out-llm-notes").textContent = d.notes.slice(1).join("; ");
    document.body.dataset.llmPreview = d.preview ? "1" : "";
    if (d.preview) return;  // the charts wait for the full run
    // the blocks in use on a scale that fits them; the pool's size in the axis title
    const kv = d.kv_usage;
    const pool = d.num_blocks_per_replica;
    const top = Math.min(pool, Math.max(1, ...kv.blocks)) * 1.15;
    plot("chart-llm-kv", [
      { name: "KV blocks in use", x: kv.time_s, y: kv.blocks, mode: "lines" },
      { name: "preemption", x: kv.preempt_time_s, y: kv.preempt_time_s.map(() => Math.min(pool, top)), mode: "markers", marker: { symbol: "x", color: "#c0392b" } },
    ], { ...LAYOUT, xaxis: { title: { text: "time (s)" } }, yaxis: { title: { text: `KV blocks (of ${pool.toLocaleString()} a replica)` }, range: [0, top] } }, CONFIG);
    // The rate chart after the read-outs, once the section has rested for a moment (six
    // rates of work: moves in a row would queue it behind their own runs).
    const run = ++LLM.runs;
    clearTimeout(LLM.sweepTimer);
    $("#llm-sweep-status").textContent = "(the chart follows when the controls rest)";
    LLM.sweepTimer = setTimeout(() => llmSweep(run, query), LLM_REST_MS);
    document.body.dataset.llmReady = "1";
    if (document.body.dataset.ready === "1") writeUrl();
  } catch (err) {
    $("#llm-status").textContent = "";
    llmError(err.message, err.key);
  } finally {
    LLM.inFlight = false;
    if (LLM.dirty) llmRefresh(LLM.dirty === "preview");
  }
}

const LLM_REST_MS = 400;  // as the paging replay waits: the controls at rest for this long

// The deployment changed in the sidebar: the section runs again once it has rested.
function llmSoon() {
  clearTimeout(LLM.soonTimer);
  $("#llm-status").textContent = "(waiting for the sidebar to rest…)";
  LLM.soonTimer = setTimeout(() => llmRefresh(), LLM_REST_MS);
}

// The rate chart's sweep for the run `run` (a newer run's sweep supersedes it): six rates
// around the page's, drawn with the validated server's measured points if any.
async function llmSweep(run, query) {
  $("#llm-sweep-status").textContent = "(simulating six rates…)";
  try {
    const d = await post("/api/llm", { ...query, sweep: true });
    if (run !== LLM.runs) return;
    LLM.sweep = d.sweep;
    $("#llm-sweep-status").textContent = "";
    const sw = d.sweep;
    const m = LLM.measured;
    // TTFT above, TPOT below: one quantity per axis, both from zero, the same rates
    plot("chart-llm-rate", [
      { name: "TTFT p99 ms", x: sw.map((r) => r.rate), y: sw.map((r) => r.ttft_p99_ms), mode: "lines+markers" },
      { name: "TPOT p99 ms", x: sw.map((r) => r.rate), y: sw.map((r) => r.tpot_p99_ms), yaxis: "y2", mode: "lines+markers" },
      ...(m ? [
        { name: "validate: measured TTFT p99", x: m.rate, y: m.ttft, mode: "markers", marker: { symbol: "x", size: 10, color: "#222" } },
        { name: "validate: measured TPOT p99", x: m.rate, y: m.tpot, yaxis: "y2", mode: "markers", marker: { symbol: "circle-open", size: 10, color: "#222" } },
      ] : []),
    ], { ...LAYOUT, xaxis: { title: { text: "requests/s" }, anchor: "y2" },
      yaxis: { title: { text: "TTFT p99 (ms)" }, rangemode: "tozero", domain: [0.56, 1] },
      yaxis2: { title: { text: "TPOT p99 (ms)" }, rangemode: "tozero", domain: [0, 0.44] },
      ...operatingPoint(query.state["llm.request_rate"]) }, CONFIG);
    document.body.dataset.llmChart = String(run);
  } catch (err) {
    if (run !== LLM.runs) return;
    $("#llm-sweep-status").textContent = "";
    llmError(err.message, err.key);
  }
}

function llmInit() {
  $("#btn-llm-validation").addEventListener("click", () => $("#file-llm-validation").click());
  $("#file-llm-validation").addEventListener("change", async (e) => {
    const file = e.target.files[0];
    if (!file) return;
    e.target.value = "";
    try {
      if (file.size > 4 * 1024 * 1024) throw new Error("LLM validation file: over 4 MiB; fix: load the validation.json that servelab llm validate --out wrote");
      const v = readLlmValidation(await file.text());
      LLM.fitted = v.fit;
      LLM.measured = v;
      // the validated server as the page's deployment: one replica, its limits and load
      state["llm.num_gpus"] = 1; state["llm.tp"] = 1; state["llm.pp"] = 1;
      setSlider("max_num_seqs", v.slots); setSlider("max_num_batched_tokens", v.batched);
      setSlider("prompt_tokens", v.prompt); setSlider("output_tokens", v.output);
      const mid = v.rate[Math.floor(v.rate.length / 2)];
      if (mid) setSlider("request_rate", mid);
      LLM.fitKey = JSON.stringify(deploymentKey(state));
      $("#out-llm-validation").textContent = ` fitted: ${v.label}; ${v.errors}`;
      $("#btn-llm-validation-remove").hidden = false;
      clearError();
      showControls();
      schedule(false);
      llmRefresh();
    } catch (err) { showError(err.message); }
  });
  showLlmControls();
  for (const [id, key] of Object.entries(LLM_SLIDERS)) {
    const el = $(`#llm-${id}`);
    // as the sidebar's sliders: a key press (input and change in one task) runs the full
    // run alone; a drag previews each move (a later task, cancelled by a change). The value
    // is the state's: the link and the exported TOML follow on release.
    const box = $(`#llm-${id}-n`);  // the typed value: the slider follows it (within its range)
    el.addEventListener("input", () => {
      box.value = el.value;
      state[key] = Number(el.value);
      clearTimeout(LLM.previewTimer);
      LLM.previewTimer = setTimeout(() => llmRefresh(true), 0);
    });
    el.addEventListener("change", () => {
      clearTimeout(LLM.previewTimer);
      state[key] = Number(el.value);
      llmRefresh();
      schedule(false);
    });
    box.addEventListener("change", () => { setSlider(id, Number(box.value)); llmRefresh(); schedule(false); });
  }
  llmRefresh();
}

init();
