// Draws snapdiff's report from the data embedded in the page: no library,
// nothing fetched.
"use strict";
const data = JSON.parse(document.getElementById("data").textContent);
const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

function size(bytes) {
  const negative = bytes < 0;
  let v = Math.abs(bytes), u = 0;
  while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
  const text = u === 0 ? `${v} B` : `${v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)} ${UNITS[u]}`;
  return negative ? `-${text}` : text;
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}

function svg(tag, attrs = {}) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

// PyTorch's pinned host memory is read as a device of its own, numbered
// u32::MAX (PINNED_HOST_DEVICE in the format crate).
function deviceName(d) {
  return d === 4294967295 ? "pinned host memory" : `device ${d}`;
}

function culprit(site) {
  const c = site.culprit;
  if (c.kind === "no_stack") return "(no stack recorded)";
  // A notebook cell as IPython names it, as the command shows it.
  const cellNumber = /^<ipython-input-(\d+)-[^>]*>$/.exec(c.file || "");
  const where = cellNumber ? `  cell In[${cellNumber[1]}], line ${c.line}`
    : c.file && c.file !== "??" ? `  ${c.file}${c.line ? ":" + c.line : ""}` : "";
  const r = site.recorded || {};
  const recorded = [["label", r.labels], ["compiled region", r.compiled_regions], ["metadata", r.metadata]]
    .flatMap(([what, values]) => (values || []).map(v => `${what} ${JSON.stringify(v)}`));
  const name = c.kind === "forward" ? `backward of ${c.name}` : c.name;
  return `${name}${where}${recorded.length ? "  (" + recorded.join(", ") + ")" : ""}`;
}

function stackText(site) {
  return (site.frames || []).map(f => `${f.name}  ${f.file}:${f.line}`).join("\n");
}

function table(headers, rows) {
  const t = el("table");
  const head = el("tr");
  for (const [h, num] of headers) head.append(el("th", num ? { class: "num" } : {}, h));
  t.append(head);
  for (const r of rows) t.append(r);
  return t;
}

function cell(text, attrs = {}) { return el("td", attrs, text); }

const tooltip = el("div", { id: "tooltip" });
document.body.append(tooltip);
function hover(target, text) {
  target.addEventListener("mousemove", ev => {
    tooltip.textContent = text();
    tooltip.style.whiteSpace = "pre";
    tooltip.style.display = "block";
    tooltip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 620) + "px";
    tooltip.style.top = ev.clientY + 14 + "px";
  });
  target.addEventListener("mouseleave", () => { tooltip.style.display = "none"; });
}

function sparkline(series) {
  const s = svg("svg", { class: "spark", viewBox: "0 0 160 28", preserveAspectRatio: "none" });
  const max = Math.max(...series, 1), n = Math.max(series.length - 1, 1);
  const pts = series.map((v, i) => `${(i / n) * 158 + 1},${27 - (v / max) * 25}`).join(" ");
  s.append(svg("polyline", { points: pts, fill: "none", stroke: "#b3261e", "stroke-width": "1.5" }));
  return s;
}

// Files of several processes: each one's verdict, the process shown below
// (the one whose memory grows most) first.
function processes(section) {
  const ps = data.processes;
  if (!ps) return;
  const leaking = ps.filter(p => p.suspects > 0).length;
  const unjudged = ps.filter(p => p.no_verdict).length;
  const box = el("p", { class: "verdict" + (leaking ? " leak" : unjudged ? " none" : ""), id: "processes-text" });
  box.textContent = leaking
    ? `${leaking} of ${ps.length} processes keep growing; the one shown below, ${ps[0].name}, most.`
    : unjudged
      ? `No verdict for ${unjudged} of ${ps.length} processes; no other process's memory keeps growing.`
      : `No process's memory keeps growing (${ps.length} processes): nothing here looks like a leak.`;
  section.append(box);
  section.append(table([["process", false], ["checkpoints", true], ["verdict", false]], ps.map(p => {
    const said = p.no_verdict ? "no verdict"
      : p.top ? `${p.suspects} site${p.suspects > 1 ? "s" : ""} keep${p.suspects > 1 ? "" : "s"} growing, ${size(p.suspected_bytes)}: ${culprit(p.top)}`
        : "nothing keeps growing";
    return el("tr", { class: "process" + (p.suspects ? " leak" : "") }, cell(p.name, { class: "culprit" }), cell(String(p.checkpoints), { class: "num" }), cell(said));
  })));
  section.append(el("h2", {}, `Process ${ps[0].name}`));
}

function verdict(section) {
  const t = data.trend;
  if (!t) return;
  // Pinned host memory is judged apart from the devices (host RAM).
  const pinned = !t.no_verdict && t.pinned_host && t.pinned_host.grows ? t.pinned_host : null;
  // So is memory outside what the snapshots record (lines as the text has them).
  const outside = t.no_verdict ? [] : data.outside_lines || [];
  const box = el("p", { class: "verdict" + (t.no_verdict ? " none" : t.suspects.length || pinned || outside.length ? " leak" : ""), id: "verdict-text" });
  if (t.no_verdict) box.textContent = "No verdict: see the notes below.";
  else if (!t.suspects.length && outside.length) box.textContent = "No site's memory keeps growing, but memory outside the sites does (below).";
  else if (!t.suspects.length && pinned) box.textContent = "No site's device memory keeps growing, but pinned host memory does (below).";
  else if (!t.suspects.length) box.textContent = "No site's memory keeps growing: nothing here looks like a leak.";
  else box.textContent = `${t.suspects.length} site${t.suspects.length > 1 ? "s" : ""} keep${t.suspects.length > 1 ? "" : "s"} growing: ${size(t.suspected_bytes)} after warm-up.`;
  section.append(box);
  if (pinned) {
    const [a, b] = [pinned.first, pinned.last];
    const what = b.in_use_bytes - a.in_use_bytes > b.cached_bytes - a.cached_bytes
      ? "pinned tensors kept alive" : "free blocks the cache keeps, not memory in use";
    section.append(el("p", { class: "verdict leak", id: "pinned-host-text" },
      `Pinned host memory keeps growing (host RAM, not the device's): ${size(a.reserved_bytes)} → ${size(b.reserved_bytes)} after warm-up, ` +
      `rising at ${pinned.rises} of ${pinned.checkpoints} checkpoints; in use ${size(a.in_use_bytes)} → ${size(b.in_use_bytes)}; ` +
      `cache ${size(b.cached_bytes)} in ${b.cached_blocks} free blocks of ${b.cached_sizes} sizes. The growth is ${what}.`));
  }
  for (const line of outside) section.append(el("p", { class: "verdict leak outside-text" }, line[0].toUpperCase() + line.slice(1) + "."));
  section.append(el("p", { class: "note" }, `${t.checkpoints} checkpoints (${t.checkpoint_source.replaceAll("_", " ")}), the first ${t.warmup} as warm-up.`));
  if (t.suspects.length) {
    // Steps are known for every checkpoint or for none; without them, all
    // that is known is the growth between two checkpoints.
    const byStep = t.suspects.every(s => s.growth_per_step != null);
    const rows = t.suspects.map((s, i) => {
      const r = el("tr", { class: "suspect", "data-growth": String(s.growth_bytes) });
      // One file's several devices are judged apart: say whose site it is.
      const name = cell(culprit(s) + (s.device != null ? ` (on device ${s.device})` : ""), { class: "culprit" });
      hover(name, () => stackText(s));
      const perStep = byStep ? size(Math.round(s.growth_per_step)) : size(s.growth_per_checkpoint);
      const evidence = el("td");
      evidence.append(sparkline(s.series));
      const floors = s.floor.slice(t.warmup).map(size).join(" → ");
      hover(evidence, () => `live: ${s.series.map(size).join(", ")}\nfloor: ${floors}\nblocks: ${s.blocks.join(", ")}`);
      r.append(cell(String(i + 1), { class: "num" }), name, cell(size(s.growth_bytes), { class: "num grow" }), cell(perStep, { class: "num" }), evidence);
      return r;
    });
    section.append(table([["", true], ["culprit", false], ["growth", true], [byStep ? "per step" : "per checkpoint", true], ["live bytes (hover: floor and blocks)", false]], rows));
    // What kept them alive, when the job said (capture's owners files).
    const held = t.suspects.flatMap((s, i) => (s.held_by || []).slice(0, 3).map(h => {
      const rate = h.blocks_per_step > 0 ? `, +${+h.blocks_per_step.toFixed(2)} a step` : "";
      const what = h.container ? `${h.owner} (a ${h.container})` : h.owner;
      return el("li", { class: "held-by" }, `${i + 1}: held by ${what}: ${h.blocks} block${h.blocks === 1 ? "" : "s"}, ${size(h.bytes)}${rate}`);
    }));
    if (held.length) {
      section.append(el("h3", {}, "Held by (what kept them alive when the last snapshot was taken)"));
      section.append(el("ul", { id: "held-by" }, ...held));
    }
  }
  for (const n of t.notes) section.append(el("p", { class: "note" }, "Note: " + n));
}

const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#edc948", "#b07aa1", "#76b7b2", "#ff9da7", "#9c755f", "#bab0ac", "#e15759"];

function timeline(section) {
  const tl = data.timeline;
  if (!tl) return;
  section.append(el("h2", {}, `Live memory over the trace (${deviceName(tl.device)})`));
  const W = 1000, H = 300, n = tl.allocated.length;
  const max = Math.max(...tl.allocated, 1);
  const x = i => (n > 1 ? (i / (n - 1)) * (W - 70) : 0) + 60;
  const y = v => H - 20 - (v / max) * (H - 30);
  const chart = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, id: "timeline" });
  for (let k = 0; k <= 4; k++) {
    const v = (max * k) / 4;
    chart.append(svg("line", { x1: 60, x2: W - 10, y1: y(v), y2: y(v), stroke: "#e3e3e3" }));
    const label = svg("text", { x: 2, y: y(v) + 4, "font-size": "11", fill: "#666" });
    label.textContent = size(Math.round(v));
    chart.append(label);
  }
  // The sites, stacked from the bottom.
  let base = new Array(n).fill(0);
  tl.sites.forEach((site, k) => {
    const top = base.map((b, i) => b + site.values[i]);
    const pts = top.map((v, i) => `${x(i)},${y(v)}`).concat(base.map((v, i) => `${x(i)},${y(v)}`).reverse());
    const area = svg("polygon", {
      points: pts.join(" "),
      fill: site.suspect ? "#e15759" : COLORS[k % COLORS.length],
      "fill-opacity": site.suspect ? "0.85" : "0.55",
      class: "site" + (site.suspect ? " suspect" : ""),
    });
    hover(area, () => `${site.label}${site.suspect ? "  (keeps growing)" : ""}\nat its highest: ${size(Math.max(...site.values))}\n\n${site.stack}`);
    chart.append(area);
    base = top;
  });
  const line = tl.allocated.map((v, i) => `${x(i)},${y(v)}`).join(" ");
  const total = svg("polyline", { points: line, fill: "none", stroke: "#222", "stroke-width": "1.5" });
  hover(total, () => `allocated, highest: ${size(max)}`);
  chart.append(total);
  section.append(chart);
  const legend = el("div", { class: "legend" });
  legend.append(el("span", {}, el("i", { style: "background:#222" }), "all allocated"));
  tl.sites.forEach((site, k) => {
    legend.append(el("span", {}, el("i", { style: `background:${site.suspect ? "#e15759" : COLORS[k % COLORS.length]}` }), site.label));
  });
  section.append(legend);
  const axis = tl.timed
    ? "left to right in the order of the trace's events"
    : "left to right in the order of the trace's events: it records no times, so nothing here is per second";
  section.append(el("p", { class: "note", id: "timeline-axis" }, `${tl.events[tl.events.length - 1]} events in ${n} points, ${axis}; each point is the highest of its stretch.`));
}

function peak(section) {
  const p = data.peak;
  if (!p) return;
  section.append(el("h2", {}, `At the peak: ${size(p.allocated_bytes)} allocated (${deviceName(p.device)}, after event ${p.event_index})`));
  section.append(table([["what", false], ["blocks", true], ["bytes", true]], p.categories.map(c =>
    el("tr", {}, cell(c.category.replaceAll("_", " ")), cell(String(c.blocks), { class: "num" }), cell(size(c.bytes), { class: "num" })))));
  section.append(table([["culprit", false], ["what", false], ["blocks", true], ["bytes", true]], p.sites.map(s => {
    const name = cell(culprit(s), { class: "culprit" });
    hover(name, () => stackText(s));
    return el("tr", { class: "peak-site", "data-bytes": String(s.bytes) }, name, cell(s.category.replaceAll("_", " ")), cell(String(s.blocks), { class: "num" }), cell(size(s.bytes), { class: "num" }));
  })));
}

function comparison(section) {
  const c = data.compare;
  if (!c) return;
  section.append(el("h2", {}, `${data.files[0]} → ${data.files[1]}`));
  const peak = c.peak_before != null ? `, peak ${size(c.peak_before)} → ${size(c.peak_after)}` : "";
  section.append(el("p", { id: "compare-text" }, `${size(c.leaked_bytes)} more live memory; allocated ${size(c.allocated_before)} → ${size(c.allocated_after)}, reserved ${size(c.reserved_before)} → ${size(c.reserved_after)}${peak}.`));
  section.append(table([["culprit", false], ["blocks", true], ["bytes", true], ["change", true]], c.groups.map(g => {
    const name = cell(culprit(g), { class: "culprit" });
    hover(name, () => stackText(g));
    const change = g.change === "rounding" ? "rounding" : size(g.delta_bytes);
    return el("tr", { class: "group", "data-delta": String(g.delta_bytes) }, name,
      cell(`${g.blocks_before} → ${g.blocks_after}`, { class: "num" }),
      cell(`${size(g.bytes_before)} → ${size(g.bytes_after)}`, { class: "num" }),
      cell(change, { class: "num " + (g.delta_bytes > 0 ? "grow" : g.delta_bytes < 0 ? "shrink" : "") }));
  })));
}

// A run against a baseline file (report --baseline): what the check said,
// each device's peak, the peak by category and by site, before and after,
// the sites whose code moved marked with where they were.
function baseline(section) {
  const b = data.baseline;
  if (!b) return;
  section.append(el("h2", {}, `Against the baseline ${b.file}`));
  const tolerance = `${Math.round(b.tolerance.share * 1000) / 10}% and ${size(b.tolerance.bytes)}`;
  const box = el("p", { class: "verdict" + (b.over.length ? " leak" : ""), id: "baseline-verdict" });
  box.textContent = b.over.length
    ? `${b.over.length} figure${b.over.length > 1 ? "s" : ""} over the baseline by more than ${tolerance}.`
    : `Within the baseline: nothing rose by more than ${tolerance}.`;
  section.append(box);
  const change = (before, now) => {
    const d = now - (before || 0);
    return cell(d === 0 ? "" : (d > 0 ? "+" : "") + size(d), { class: "num " + (d > 0 ? "grow" : d < 0 ? "shrink" : "") });
  };
  section.append(table([["", false], ["peak allocated", true], ["change", true], ["peak reserved", true], ["change", true]], b.devices.map(d =>
    el("tr", {}, cell(deviceName(d.device)),
      cell(`${d.allocated_before != null ? size(d.allocated_before) : "(none)"} → ${size(d.allocated_now)}`, { class: "num" }), change(d.allocated_before, d.allocated_now),
      cell(`${d.reserved_before != null ? size(d.reserved_before) : "(none)"} → ${size(d.reserved_now)}`, { class: "num" }), change(d.reserved_before, d.reserved_now)))));
  section.append(table([["at the peak", false], ["baseline", true], ["this run", true], ["change", true]], b.categories.map(c =>
    el("tr", { class: "baseline-category" }, cell(`${c.category.replaceAll("_", " ")}${b.devices.length > 1 ? " (" + deviceName(c.device) + ")" : ""}`),
      cell(size(c.before), { class: "num" }), cell(size(c.now), { class: "num" }), change(c.before, c.now)))));
  const over = new Set(b.over.filter(o => o.key).map(o => `${o.device} ${o.key} ${o.line}`));
  section.append(table([["site", false], ["what", false], ["baseline", true], ["this run", true], ["change", true]], b.sites.map(s => {
    const name = cell(`${s.line}${b.devices.length > 1 ? " (" + deviceName(s.device) + ")" : ""}`, { class: "culprit" });
    if (s.was) name.append(el("span", { class: "moved" }, ` moved from ${s.was}`));
    const tags = (over.has(`${s.device} ${s.key} ${s.line}`) ? " over" : "") + (s.was ? " moved" : "");
    return el("tr", { class: "baseline-site" + tags, "data-delta": String(s.now - s.before) }, name,
      cell((s.category || "unknown").replaceAll("_", " ")), cell(size(s.before), { class: "num" }), cell(size(s.now), { class: "num" }), change(s.before, s.now));
  })));
  const more = [];
  if (b.more_sites) more.push(`${b.more_sites} more site${b.more_sites > 1 ? "s" : ""} not shown (smaller changes)`);
  if (b.moved) more.push(`${b.moved} site${b.moved > 1 ? "s" : ""} whose code moved (matched by their functions and files, as check matches them)`);
  if (more.length) section.append(el("p", { class: "note" }, more.join("; ") + "."));
}

// A whole job (report --fleet): the verdict, the leaking lines and the
// imbalanced ranks, a heat map of every rank's live memory over its
// checkpoints, and one rank's own report, opened by a click (or #rank=N).
function rankName(r) { return r.rank != null ? `rank ${r.rank}` : r.process; }

function rankLinks(names) {
  const shown = names.slice(0, 12);
  const span = el("span", { class: "ranks" });
  shown.forEach((n, i) => {
    if (i) span.append(", ");
    span.append(el("a", { href: `#rank=${encodeURIComponent(n.key)}` }, n.label));
  });
  if (names.length > shown.length) span.append(` and ${names.length - shown.length} more`);
  return span;
}

function memberKey(m) { return m.rank != null ? String(m.rank) : m.process; }

function fleet(section) {
  const f = data.fleet;
  if (!f) return;
  const unjudged = f.too_few_checkpoints ? `, ${f.too_few_checkpoints} with too few checkpoints to judge` : "";
  const box = el("p", { class: "verdict" + (f.leaking ? " leak" : f.too_few_checkpoints === f.processes ? " none" : ""), id: "fleet-text" });
  box.textContent = `${f.processes} rank${f.processes === 1 ? "" : "s"} read from ${f.files} snapshot${f.files === 1 ? "" : "s"} (${size(f.bytes)}): ${f.steady} steady, ${f.leaking} leaking${unjudged}.`;
  section.append(box);
  for (const u of f.unreadable.slice(0, 10)) section.append(el("p", { class: "note unreadable" }, "Could not be read: " + u.error));
  if (f.unreadable.length > 10) section.append(el("p", { class: "note" }, `and ${f.unreadable.length - 10} more files could not be read`));
  if (f.leaks.length) {
    section.append(el("h2", {}, "Leaking lines (memory that keeps growing)"));
    section.append(table([["culprit", false], ["ranks", false], ["growth a step", true], ["held by", false]], f.leaks.map(l => {
      const name = cell(culprit(l.site), { class: "culprit" });
      hover(name, () => stackText(l.site));
      const rates = l.members.map(m => m.growth_per_step != null ? m.growth_per_step : m.growth_per_checkpoint);
      const [lo, hi] = [Math.min(...rates), Math.max(...rates)];
      const rate = size(Math.round(lo)) === size(Math.round(hi)) ? size(Math.round(lo)) : `${size(Math.round(lo))} to ${size(Math.round(hi))}`;
      const ranks = el("td");
      ranks.append(rankLinks(l.members.map(m => ({ key: memberKey(m), label: rankName(m) }))));
      const held = l.held_by && l.held_by.length ? l.held_by[0].owner : "";
      return el("tr", { class: "fleet-leak", "data-ranks": l.members.map(memberKey).join(",") }, name, ranks, cell(rate, { class: "num grow" }), cell(held, { class: "culprit" }));
    })));
  } else if (f.too_few_checkpoints < f.processes) {
    section.append(el("p", { class: "note" }, "No rank's memory keeps growing at any line."));
  }
  if (f.imbalance.length) {
    section.append(el("h2", {}, "Imbalance (ranks holding far more than the median rank; not growth)"));
    section.append(table([["culprit", false], ["ranks", false], ["median", true], ["most over it", true]], f.imbalance.map(i => {
      const name = cell(culprit(i.site), { class: "culprit" });
      hover(name, () => stackText(i.site));
      const ranks = el("td");
      ranks.append(rankLinks(i.members.map(m => ({ key: memberKey(m), label: rankName(m) }))));
      return el("tr", { class: "fleet-imbalance", "data-ranks": i.members.map(memberKey).join(",") }, name, ranks,
        cell(size(i.median_bytes), { class: "num" }), cell(size(Math.max(...i.members.map(m => m.excess_bytes))), { class: "num" }));
    })));
  }
  heatmap(section, f);
  section.append(el("div", { id: "rank-panel" }));
  for (const n of f.notes) section.append(el("p", { class: "note" }, "Note: " + n));
  const open = () => {
    const m = /^#rank=(.+)$/.exec(location.hash);
    if (m) rankReport(f, decodeURIComponent(m[1]));
  };
  window.addEventListener("hashchange", open);
  open();
}

// Rows: ranks in order; columns: their checkpoints. Each cell is the
// rank's live memory against the median rank's at that checkpoint: red
// above it, blue below, deeper the farther (on a log scale, from 1 MiB
// to the largest difference). A leak reddens toward the right; an
// imbalanced rank is red throughout. A red mark before a leaking rank,
// amber before an imbalanced one.
function heatmap(section, f) {
  const ranks = f.ranks;
  if (!ranks.length) return;
  const columns = Math.max(...ranks.map(r => r.allocated.length), 1);
  const medians = [];
  for (let c = 0; c < columns; c++) {
    const values = ranks.map(r => r.allocated[c]).filter(v => v != null).sort((a, b) => a - b);
    medians.push(values.length ? values[Math.floor(values.length / 2)] : 0);
  }
  const MiB = 1048576;
  let most = MiB;
  for (const r of ranks) r.allocated.forEach((v, c) => { most = Math.max(most, Math.abs(v - medians[c])); });
  const depth = d => Math.min(1, Math.log1p(Math.abs(d) / MiB) / Math.log1p(most / MiB));
  const rowH = Math.max(1, Math.min(14, Math.floor(700 / ranks.length)));
  const gutter = 8, width = 960, cellW = (width - gutter) / columns;
  section.append(el("h2", {}, `Every rank's live memory over its checkpoints, against the median rank (${ranks.length} rows; click one for its report)`));
  section.append(el("p", { class: "note" }, `Red: more than the median rank at that checkpoint, blue: less, deeper the farther (up to ${size(most)}). A leak reddens toward the right; an imbalanced rank is red throughout.`));
  const canvas = el("canvas", { id: "heatmap", class: "heatmap", width: String(width), height: String(ranks.length * rowH), "data-rows": String(ranks.length), "data-columns": String(columns) });
  const g = canvas.getContext("2d");
  const imbalanced = new Set(f.imbalance.flatMap(i => i.members.map(memberKey)));
  ranks.forEach((r, row) => {
    const y = row * rowH;
    g.fillStyle = r.verdict === "leaking" ? "#d62728" : imbalanced.has(memberKey(r)) ? "#f0a30a" : "#ffffff";
    g.fillRect(0, y, gutter - 2, rowH);
    r.allocated.forEach((v, c) => {
      const d = v - medians[c], t = depth(d);
      g.fillStyle = d >= 0
        ? `rgb(255,${Math.round(255 - 215 * t)},${Math.round(255 - 215 * t)})`
        : `rgb(${Math.round(255 - 215 * t)},${Math.round(255 - 150 * t)},255)`;
      g.fillRect(gutter + c * cellW, y, Math.ceil(cellW), rowH);
    });
  });
  const at = ev => {
    const box = canvas.getBoundingClientRect();
    const row = Math.floor(((ev.clientY - box.top) / box.height) * ranks.length);
    const col = Math.floor((((ev.clientX - box.left) / box.width) * width - gutter) / cellW);
    return [ranks[Math.min(Math.max(row, 0), ranks.length - 1)], col];
  };
  canvas.addEventListener("mousemove", ev => {
    const [r, col] = at(ev);
    const v = r.allocated[col];
    const step = r.steps[col] != null ? `step ${r.steps[col]}` : `checkpoint ${col + 1}`;
    const against = v != null ? v - medians[col] : 0;
    tooltip.textContent = `${rankName(r)} (${r.verdict.replaceAll("_", " ")})` + (v != null ? `\n${step}: ${size(v)} allocated, ${against >= 0 ? "+" : ""}${size(against)} against the median rank` : "");
    tooltip.style.whiteSpace = "pre";
    tooltip.style.display = "block";
    tooltip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 620) + "px";
    tooltip.style.top = ev.clientY + 14 + "px";
  });
  canvas.addEventListener("mouseleave", () => { tooltip.style.display = "none"; });
  canvas.addEventListener("click", ev => { location.hash = `rank=${encodeURIComponent(memberKey(at(ev)[0]))}`; });
  section.append(canvas);
}

// One rank's own report: its verdict, its suspects with their evidence,
// its live memory over its checkpoints, its notes.
function rankReport(f, key) {
  const panel = document.getElementById("rank-panel");
  panel.replaceChildren();
  const members = f.ranks.filter(r => memberKey(r) === key);
  if (!members.length) { panel.append(el("p", { class: "note" }, `No rank ${key} in this job.`)); return; }
  panel.setAttribute("data-process", members[0].process);
  for (const r of members) {
    panel.append(el("h2", {}, `${rankName(r)}${members.length > 1 ? `, device ${r.device}` : ""}: ${r.verdict.replaceAll("_", " ")}`));
    const live = el("p", { class: "note" }, `Live memory over ${r.allocated.length} checkpoints: `);
    live.append(sparkline(r.allocated));
    hover(live, () => r.allocated.map((v, i) => `${r.steps[i] != null ? "step " + r.steps[i] : "checkpoint " + (i + 1)}: ${size(v)}`).join("\n"));
    panel.append(live);
    if (r.suspects.length) {
      panel.append(table([["culprit", false], ["growth", true], ["per step", true], ["live bytes", false]], r.suspects.map(s => {
        const name = cell(culprit(s), { class: "culprit" });
        hover(name, () => stackText(s));
        const evidence = el("td");
        evidence.append(sparkline(s.series));
        const perStep = s.growth_per_step != null ? size(Math.round(s.growth_per_step)) : size(s.growth_per_checkpoint) + " a checkpoint";
        return el("tr", { class: "suspect" }, name, cell(size(s.growth_bytes), { class: "num grow" }), cell(perStep, { class: "num" }), evidence);
      })));
    }
    for (const n of r.notes) panel.append(el("p", { class: "note" }, "Note: " + n));
  }
  panel.scrollIntoView();
}

const main = document.getElementById("report");
fleet(main);
processes(main);
verdict(main);
baseline(main);
comparison(main);
timeline(main);
peak(main);
document.body.setAttribute("data-render-ms", String(Math.round(performance.now())));
document.body.setAttribute("data-ready", "yes");
