// The dashboard page: one HTML document with its script and styles, served
// as it is by `corolla api` and `corolla dashboard` at GET / (no build
// step). It polls GET /swarm.json once a second and draws each server's span
// as a bar over the model's blocks (SVG), the coverage of every block, the
// server table and the recent changes. Elements carry data-* attributes
// (data-node, data-state, data-block) so the browser test can read them.
#include "api/dashboard.hpp"

namespace corolla::api {

const std::string& dashboard_html() {
  static const std::string page = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>corolla swarm</title>
<style>
  :root { --bg:#0f1419; --panel:#182028; --text:#e6edf3; --dim:#8b98a5; --online:#3fb950; --joining:#d29922;
          --offline:#6e7681; --gap:#f85149; --grid:#2d3640; }
  * { box-sizing: border-box; }
  body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; background:var(--bg); color:var(--text); }
  header { padding:16px 24px; border-bottom:1px solid var(--grid); display:flex; gap:32px; align-items:baseline; flex-wrap:wrap; }
  header h1 { font-size:18px; margin:0; font-weight:600; }
  .stat { color:var(--dim); } .stat b { color:var(--text); font-size:16px; }
  main { padding:16px 24px; display:grid; gap:16px; }
  section { background:var(--panel); border-radius:8px; padding:12px 16px; }
  section h2 { font-size:13px; text-transform:uppercase; letter-spacing:.06em; color:var(--dim); margin:0 0 8px; }
  svg text { fill:var(--text); font-size:12px; }
  svg .axis { fill:var(--dim); font-size:11px; }
  table { border-collapse:collapse; width:100%; font-variant-numeric:tabular-nums; }
  th, td { text-align:left; padding:4px 10px 4px 0; border-bottom:1px solid var(--grid); white-space:nowrap; }
  th { color:var(--dim); font-weight:500; }
  .pill { padding:1px 8px; border-radius:10px; font-size:12px; color:#0f1419; }
  .online { background:var(--online); } .joining { background:var(--joining); } .offline { background:var(--offline); }
  #status.bad { color:var(--gap); } #status.good { color:var(--online); }
  ul#events { list-style:none; margin:0; padding:0; max-height:220px; overflow:auto; }
  ul#events li { padding:2px 0; color:var(--dim); } ul#events li b { color:var(--text); font-weight:500; }
  .note { color:var(--dim); font-size:12px; }
</style>
</head>
<body>
<header>
  <h1 id="model">corolla swarm</h1>
  <span class="stat">servers online <b id="online">–</b></span>
  <span class="stat">blocks <b id="blocks">–</b></span>
  <span class="stat">bottleneck <b id="bottleneck">–</b> tokens/s</span>
  <span class="stat">coverage <b id="status">–</b></span>
  <span class="stat note" id="updated"></span>
</header>
<main>
  <section><h2>Spans over the model's blocks</h2><svg id="spans" width="100%" height="60" role="img" aria-label="server spans"></svg></section>
  <section><h2>Servers</h2>
    <table><thead><tr><th>server</th><th>state</th><th>blocks</th><th>throughput</th><th>cache left</th>
      <th>step / block</th><th>RTT to next</th><th>weights</th><th>adapters</th><th>activations</th><th>link</th><th>record age</th><th>endpoint</th></tr></thead>
      <tbody id="servers"></tbody></table>
  </section>
  <section><h2>Recent changes</h2><ul id="events"></ul></section>
</main>
<script>
"use strict";
const NS = "http://www.w3.org/2000/svg";
const COLOR = {online: "#3fb950", joining: "#d29922", offline: "#6e7681", gap: "#f85149", grid: "#2d3640"};
const fmt = (x, d = 1) => (x === null || x === undefined || !isFinite(x)) ? "–" : Number(x).toFixed(d);
const rate = (x) => !isFinite(x) ? "–" : x >= 100 ? Math.round(x).toLocaleString("en-US") : Number(x).toFixed(1);
const duration = (ms) => !(ms > 0) ? "–" : ms < 1 ? (ms * 1000).toFixed(0) + " µs" : fmt(ms, 2) + " ms";
const el = (name, attrs = {}, text) => {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
};
function cell(row, text, cls) { const td = row.insertCell(); td.textContent = text; if (cls) td.className = cls; return td; }

function drawSpans(v) {
  const svg = document.getElementById("spans");
  const width = Math.max(svg.clientWidth || 800, 400), left = 150, right = 16, rowH = 24, top = 20;
  const n = Math.max(v.blocks, 1), bw = (width - left - right) / n;
  const rows = v.servers.length;
  const height = top + rowH * (rows + 1) + 8;
  svg.setAttribute("height", height);
  svg.replaceChildren();
  for (let b = 0; b <= n; b++) {
    const x = left + b * bw;
    svg.appendChild(el("line", {x1: x, x2: x, y1: top - 4, y2: height - 4, stroke: COLOR.grid}));
    if (b < n && (n <= 40 || b % Math.ceil(n / 40) === 0))
      svg.appendChild(el("text", {x: x + bw / 2, y: top - 8, "text-anchor": "middle", class: "axis"}, String(b)));
  }
  v.servers.forEach((s, i) => {
    const y = top + i * rowH;
    const g = el("g", {class: "server", "data-node": s.node_id, "data-state": s.state,
                       "data-span": s.span[0] + ":" + s.span[1]});
    g.appendChild(el("text", {x: 0, y: y + 16}, s.node_id.length > 20 ? s.node_id.slice(0, 19) + "…" : s.node_id));
    const rect = el("rect", {x: left + s.span[0] * bw + 1, y: y + 3, width: Math.max((s.span[1] - s.span[0]) * bw - 2, 2),
                             height: rowH - 6, rx: 4, fill: COLOR[s.state] || COLOR.offline});
    rect.appendChild(el("title", {}, `${s.node_id}: blocks [${s.span[0]}, ${s.span[1]}), ${s.state}, ${rate(s.throughput)} tokens/s`));
    g.appendChild(rect);
    g.appendChild(el("text", {x: left + s.span[0] * bw + 8, y: y + 16, style: "fill:#0f1419"},
                     `${rate(s.throughput)} tok/s`));
    svg.appendChild(g);
  });
  // Coverage: online servers per block; red where no client can route.
  const cy = top + rows * rowH + 4;
  svg.appendChild(el("text", {x: 0, y: cy + 14, class: "axis"}, "online per block"));
  (v.coverage.length ? v.coverage : new Array(v.blocks).fill(0)).forEach((c, b) => {
    const r = el("rect", {x: left + b * bw + 1, y: cy, width: Math.max(bw - 2, 1), height: rowH - 6, rx: 3,
                          class: "block", "data-block": b, "data-online": c,
                          fill: c === 0 ? COLOR.gap : COLOR.online, "fill-opacity": c === 0 ? 1 : Math.min(0.35 + 0.25 * c, 1)});
    r.appendChild(el("title", {}, `block ${b}: ${c} online server(s), ${rate(v.block_throughput[b])} tokens/s`));
    svg.appendChild(r);
    if (bw >= 18) svg.appendChild(el("text", {x: left + b * bw + bw / 2, y: cy + 13, "text-anchor": "middle", style: "fill:#0f1419"}, String(c)));
  });
}

function render(v) {
  document.getElementById("model").textContent = v.model + (v.local ? " (local)" : "");
  const online = v.servers.filter(s => s.state === "online").length;
  document.getElementById("online").textContent = `${online} / ${v.servers.length}`;
  document.getElementById("blocks").textContent = v.blocks;
  document.getElementById("bottleneck").textContent = rate(v.bottleneck_throughput);
  const st = document.getElementById("status");
  st.textContent = v.local ? "local model" : v.complete ? "every block served" : "gaps: no route";
  st.className = v.local || v.complete ? "good" : "bad";
  document.getElementById("updated").textContent = "updated " + new Date(v.now_ms).toLocaleTimeString();
  drawSpans(v);
  const body = document.getElementById("servers");
  body.replaceChildren();
  for (const s of v.servers) {
    const row = body.insertRow();
    row.dataset.node = s.node_id;
    row.dataset.state = s.state;
    cell(row, s.node_id);
    const p = cell(row, ""); const pill = document.createElement("span");
    pill.className = "pill " + s.state; pill.textContent = s.state; p.appendChild(pill);
    cell(row, `[${s.span[0]}, ${s.span[1]})`);
    cell(row, rate(s.throughput) + " tok/s");
    cell(row, s.cache_tokens_left < 0 ? "unknown" : s.cache_tokens_left.toLocaleString() + " tokens");
    cell(row, duration(s.step_ms_per_block));
    const rtts = Object.entries(s.rtt_ms).map(([k, ms]) => `${k} ${fmt(ms, 1)} ms`);
    cell(row, rtts.length ? rtts.join(", ") : "–");
    cell(row, s.weights || "–");
    const held = Object.entries(s.adapters || {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    const ad = cell(row, held.length ? held.map(([name]) => name).join(", ") : "–", "adapters");
    ad.title = held.map(([name, digest]) => name + "@" + digest).join("\n");
    cell(row, s.dtype);
    cell(row, s.relayed ? "through " + s.relay : (s.relay_service ? "direct, relays" : "direct"));
    cell(row, fmt(s.age_ms / 1000, 1) + " s");
    cell(row, s.endpoint);
  }
  const list = document.getElementById("events");
  list.replaceChildren();
  for (const e of v.events) {
    const li = document.createElement("li");
    li.dataset.kind = e.kind;
    const b = document.createElement("b");
    b.textContent = `${e.kind}${e.node_id ? " " + e.node_id : ""}`;
    li.append(new Date(e.at_ms).toLocaleTimeString() + " ", b, e.detail ? " — " + e.detail : "");
    list.appendChild(li);
  }
  if (!v.events.length) list.innerHTML = '<li class="note">none yet</li>';
}

async function poll() {
  try {
    const r = await fetch("/swarm.json", {cache: "no-store"});
    if (r.ok) render(await r.json());
  } catch (e) {
    document.getElementById("updated").textContent = "cannot reach the server: " + e;
  }
  setTimeout(poll, 1000);
}
poll();
</script>
</body>
</html>
)HTML";
  return page;
}

}  // namespace corolla::api
