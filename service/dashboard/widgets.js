// What the dashboard's pages beyond the job list and the job page share (sweeps.js,
// compare.js, resources.js, jobextras.js): tables that scroll on a phone and sort by any
// column, number and size formats, owner/team columns where the API has them, charts, and
// downloads that carry the API token. Loaded after app.js, whose helpers it extends.
"use strict";

(() => {
  const ty = window.torchyard;
  const {h} = ty;

  // A table in a box that scrolls sideways on a narrow screen instead of widening the page.
  function scroller(table) {
    return h("div", {class: "scroll"}, table);
  }

  function fmtValue(v) {
    if (v === null || v === undefined) return "";
    if (typeof v !== "number") return String(v);  // "NaN", "Infinity" as the API spells them
    if (Number.isInteger(v) && Math.abs(v) < 1e6) return String(v);
    return Math.abs(v) >= 1e-3 && Math.abs(v) < 1e5 ? String(Number(v.toPrecision(5)))
      : v.toExponential(3);
  }

  function fmtBytes(n) {
    if (n === null || n === undefined) return "";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    let v = n;
    while (v >= 1024 && i < units.length - 1) {
      v /= 1024;
      i += 1;
    }
    return i === 0 ? `${n} B` : `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
  }

  function ago(text) {
    const t = ty.parseTime(text);
    return t ? ty.duration((Date.now() - t) / 1000) : "";
  }

  function timeCell(text) {
    const t = ty.parseTime(text);
    return h("td", {title: t ? t.toISOString() : ""}, t ? ago(text) : "");
  }

  // Owner and team come with users and teams (another issue); until the API has them a table
  // shows neither column. people(rows) → the columns present in any row.
  function people(rows) {
    return ["owner", "team"].filter((k) => rows.some((r) => r && r[k] !== undefined && r[k] !== null));
  }

  function personCell(value) {
    if (value === null || value === undefined) return "";
    return typeof value === "object" ? (value.name || value.id || JSON.stringify(value)) : value;
  }

  // A table sortable by any column. columns: [{key, label, value(row) → sort key, cell(row) →
  // td content, cls}]; state: {key, dir: 1 | -1}, kept by the caller across redraws. Missing
  // values sort last either way. Each header is a button (keyboard: Tab, Enter).
  function sortedRows(rows, columns, state) {
    const col = columns.find((c) => c.key === state.key);
    if (!col) return rows;
    const value = col.value || ((r) => r[col.key]);
    const keyed = rows.map((r, i) => ({r, i, v: value(r)}));
    const missing = (v) => v === null || v === undefined || v === "" || Number.isNaN(v);
    keyed.sort((a, b) => {
      if (missing(a.v) || missing(b.v)) {
        return missing(a.v) === missing(b.v) ? a.i - b.i : missing(a.v) ? 1 : -1;
      }
      const c = typeof a.v === "number" && typeof b.v === "number" ? a.v - b.v
        : String(a.v).localeCompare(String(b.v), undefined, {numeric: true});
      return c === 0 ? a.i - b.i : c * state.dir;
    });
    return keyed.map((k) => k.r);
  }

  function sortableTable({id, columns, rows, state, redraw, rowAttrs}) {
    const head = h("tr", {}, columns.map((c) => {
      if (c.sortable === false) return h("th", {class: c.cls}, c.label);
      const active = state.key === c.key;
      const sort = active ? (state.dir > 0 ? "ascending" : "descending") : "none";
      return h("th", {"aria-sort": sort, class: c.cls},
        h("button", {type: "button", class: "sort", "data-focus": `sort-${c.key}`,
                     "data-sort": c.key, onclick: () => {
            state.dir = active ? -state.dir : 1;
            state.key = c.key;
            redraw();
          }}, c.label, h("span", {"aria-hidden": "true"}, active ? (state.dir > 0 ? " ▲" : " ▼") : "")));
    }));
    const body = sortedRows(rows, columns, state).map((r) => h("tr", rowAttrs ? rowAttrs(r) : {},
      columns.map((c) => h("td", {class: c.cls}, c.cell ? c.cell(r) : fmtValue(r[c.key])))));
    return h("table", {id, class: "grid"}, h("thead", {}, head), h("tbody", {}, body));
  }

  // plotly.js with the dashboard's defaults: resizes with the page, no logo. Loads plotly.js
  // on first use (ty.loadPlotly).
  async function plot(el, traces, layout) {
    try {
      await ty.loadPlotly();
    } catch (err) {
      ty.reportError(err);
      return;
    }
    // The legend sits at the bottom of the box, below the axis title, however narrow the box.
    const base = {margin: {l: 60, r: 20, t: 30, b: 95},
                  legend: {orientation: "h", yref: "container", y: 0, yanchor: "bottom"}};
    window.Plotly.react(el, traces, {...base, ...layout}, {responsive: true, displaylogo: false});
    el.dataset.updates = String(Number(el.dataset.updates || 0) + 1);
  }

  const toNumber = (v) => (typeof v === "number" ? v : null);  // "NaN"… are gaps in a line

  // Viridis (plotly's colour scale of that name), t in 0..1 → an rgb() colour.
  const VIRIDIS = [[0, [68, 1, 84]], [0.25, [59, 82, 139]], [0.5, [33, 145, 140]],
                   [0.75, [94, 201, 98]], [1, [253, 231, 37]]];

  function viridis(t) {
    const u = Math.min(1, Math.max(0, t));
    const k = VIRIDIS.findIndex(([at]) => at >= u);
    if (k <= 0) return `rgb(${VIRIDIS[0][1].join(",")})`;
    const [a, ca] = VIRIDIS[k - 1];
    const [b, cb] = VIRIDIS[k];
    const f = (u - a) / (b - a);
    return `rgb(${ca.map((c, i) => Math.round(c + f * (cb[i] - c))).join(",")})`;
  }

  // An axis of values for a chart drawn on 0..1 (parallel coordinates): numbers scaled between
  // their extremes (on log10 when log and all are positive), anything else by level.
  function axisOf(label, raw, log) {
    if (raw.every((v) => typeof v === "number")) {
      log = log && raw.every((v) => v > 0);
      const values = log ? raw.map(Math.log10) : raw;
      const lo = Math.min(...values);
      const hi = Math.max(...values);
      const at = lo === hi ? [lo] : [lo, lo + (hi - lo) / 2, hi];
      return {label: log ? `${label} (log)` : label, values, lo, hi,
              ticks: at.map((v) => [v, ty.fmtValue(log ? 10 ** v : v)])};
    }
    const levels = [...new Set(raw.map(String))].sort();
    const values = raw.map((v) => levels.indexOf(String(v)));
    return {label, values, lo: 0, hi: levels.length - 1, ticks: levels.map((l, k) => [k, l])};
  }

  // A link to a file the API serves. Followed as it is, it streams straight to disk; that is
  // what happens without a token. With a token (which a link cannot send) the file is fetched
  // with it and saved from memory (Chromium keeps a large blob on disk, not in RAM).
  function downloadLink(href, name, attrs = {}) {
    const link = h("a", {href, download: name, ...attrs}, name);
    link.addEventListener("click", async (ev) => {
      const token = localStorage.getItem(ty.TOKEN_KEY);
      if (!token) return;
      ev.preventDefault();
      try {
        const resp = await fetch(href, {headers: {Authorization: `Bearer ${token}`}});
        if (!resp.ok) throw new ty.ApiFailure(resp.status, await resp.json().catch(() => null));
        const url = URL.createObjectURL(await resp.blob());
        const save = h("a", {href: url, download: name, hidden: true});
        document.body.append(save);
        save.click();
        save.remove();
        setTimeout(() => URL.revokeObjectURL(url), 60_000);
      } catch (err) {
        ty.reportError(err);
      }
    });
    return link;
  }

  Object.assign(ty, {
    scroller, fmtValue, fmtBytes, ago, timeCell, people, personCell, sortableTable, plot,
    toNumber, downloadLink, viridis, axisOf,
  });
})();
