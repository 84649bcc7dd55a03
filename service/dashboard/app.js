// torchyard dashboard: a single page that reads the REST API (no build step, no framework).
// Routes live in the URL hash so they never collide with API paths:
//   #/?state=&name=&label=   job list with filters
//   #/jobs/<id>              one job: per-rank curves (live), phases, attempts, divergence, logs
//   #/submit[?copy=<id>]     submit a JSON spec (pre-filled with a job's spec: "Submit a copy")
// More pages live in files of their own (sweeps.js, compare.js, resources.js, jobextras.js),
// loaded after this one: they register routes and job-page panels on window.torchyard.
// When the server has API tokens, the token pasted by the user (kept in localStorage) is sent as
// "Authorization: Bearer"; a 401 opens the token form. Who is signed in comes from GET /me; what
// their role cannot do is not offered (a viewer has no Cancel, Pause or Submit); "Sign out"
// forgets the token.
"use strict";

(() => {
  const TOKEN_KEY = "torchyard.token";
  const POLL_MS = 1000;
  const LIST_POLL_MS = 2000;
  const LOG_CAP_CHARS = 1_000_000;
  const LOG_PAGE_BYTES = 64 * 1024;
  const SERIES_MAX_POINTS = 2000;
  const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
  const STATES = ["queued", "starting", "running", "pausing", "paused", "succeeded", "failed",
                  "cancelled"];
  const PAUSABLE = new Set(["queued", "starting", "running"]);
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  const DASHES = ["solid", "dot", "dash", "longdash", "dashdot"];
  const DEFAULT_SPEC = {name: "digits-ddp", model: "mlp", dataset: "digits", epochs: 5,
                        batch_size: 64, lr: 0.05, nproc_per_node: 2};

  // ---- small helpers ------------------------------------------------------------------------

  class ApiFailure extends Error {
    constructor(status, body) {
      super((body && body.message) || `HTTP ${status}`);
      this.status = status;
      this.body = body;
    }
  }

  function h(tag, attrs = {}, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "class") el.className = v;
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c !== undefined && c !== null) el.append(c instanceof Node ? c : String(c));
    }
    return el;
  }

  // The API writes naive UTC timestamps; read them as UTC.
  function parseTime(s) {
    if (!s) return null;
    return new Date(/[zZ]|[+-]\d\d:?\d\d$/.test(s) ? s : s + "Z");
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "";
    const s = Math.max(0, seconds);
    if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
    return `${Math.floor(s / 86400)} d ${Math.round((s % 86400) / 3600)} h`;
  }

  // Re-drawing a table must not take the keyboard's place away: the control that had focus is
  // found again in what draw() made by its data-focus key, and focused.
  function keepFocus(container, draw) {
    const had = document.activeElement;
    const key = had && container.contains(had) ? had.dataset.focus : undefined;
    draw();
    if (!key) return;
    const again = container.querySelector(`[data-focus="${CSS.escape(key)}"]`);
    if (again) again.focus({preventScroll: true});
  }

  // plotly.js (4.6 MB) is loaded by the first page that draws a chart, not by the shell: the
  // lists (jobs, sweeps, resources) draw without waiting for it. A page starts it early and
  // awaits it before its first chart.
  let plotlyLoad = null;
  function loadPlotly() {
    if (window.Plotly) return Promise.resolve(window.Plotly);
    plotlyLoad = plotlyLoad || new Promise((resolve, reject) => {
      const script = h("script", {src: "/static/plotly.min.js"});
      script.addEventListener("load", () => resolve(window.Plotly));
      script.addEventListener("error", () => {
        plotlyLoad = null;
        reject(new Error("the chart library (/static/plotly.min.js) did not load"));
      });
      document.head.append(script);
    });
    return plotlyLoad;
  }

  function stateBadge(state) {
    return h("span", {class: `state state-${state}`}, state);
  }

  function showNotice(text) {
    const el = document.getElementById("notice");
    el.textContent = text || "";
    el.hidden = !text;
  }

  // ---- API access and the token -------------------------------------------------------------

  let me = null;  // GET /me: {user, team, role, token_id, via}; null until known (or no route)

  // Whether the signed-in user may control jobs (cancel, pause, submit): members and admins.
  function canControl() {
    return !me || me.role !== "viewer";
  }

  function showWho() {
    const who = document.getElementById("whoami");
    const signOut = document.getElementById("sign-out");
    who.hidden = !me;
    signOut.hidden = !me || me.via === "open";
    if (me) {
      who.textContent = me.via === "open" ? "open server (no sign-in)"
        : `${me.user} · ${me.role}${me.team ? ` · ${me.team}` : ""}`;
    }
    document.getElementById("nav-submit").hidden = !canControl();
  }

  async function refreshMe() {
    try {
      me = await api("/me");
    } catch (err) {
      me = null;  // 401: the token form asks; 404: a server without users
    }
    showWho();
  }

  function askForToken(message) {
    const form = document.getElementById("token-form");
    document.getElementById("token-message").textContent = message;
    form.hidden = false;
    document.getElementById("token-input").focus();
  }

  async function api(path, options = {}) {
    const headers = {...(options.headers || {})};
    const token = localStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    const init = {method: options.method || "GET", headers};
    if (options.json !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(options.json);
    }
    let resp;
    try {
      resp = await fetch(path, init);
    } catch (err) {
      throw new ApiFailure(0, {message: `server unreachable (${err.message})`});
    }
    const text = await resp.text();
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch { body = {message: text}; }
    if (resp.status === 401) {
      askForToken(token ? "The API token was refused (401): paste another one."
                        : "This server needs an API token (401): paste one to continue.");
    }
    if (!resp.ok) throw new ApiFailure(resp.status, body);
    return body;
  }

  function reportError(err) {
    if (err instanceof ApiFailure && err.status === 401) return;  // the token form says it
    showNotice(err.message || String(err));
  }

  // Calls fn every ms until stop() or until fn returns false; errors are shown, not fatal.
  function poller(fn, ms) {
    let stopped = false;
    let timer = null;
    const tick = async () => {
      if (stopped) return;
      let again = true;
      try {
        again = (await fn()) !== false;
      } catch (err) {
        reportError(err);
      }
      if (!stopped && again) timer = setTimeout(tick, typeof ms === "function" ? ms() : ms);
    };
    tick();
    return {stop() { stopped = true; clearTimeout(timer); }};
  }

  // What the other files of the dashboard use; they add routes ({path: RegExp, page(match,
  // query) → {stop()}}), job-page panels (jobId → {top?, section?, update(job), stop()}) and
  // hooks (listSelect, copiedSpec). Every route is resolved at DOMContentLoaded, once all of them
  // are loaded.
  const ext = Object.assign(window.torchyard || {}, {
    h, api, ApiFailure, poller, showNotice, reportError, stateBadge, parseTime, duration,
    keepFocus, loadPlotly, PALETTE, DASHES, TERMINAL, POLL_MS, LIST_POLL_MS, SERIES_MAX_POINTS, TOKEN_KEY,
    canControl,  // false for a viewer: pages offer no Cancel, Pause or Submit
  });
  ext.routes = ext.routes || [];
  ext.jobPanels = ext.jobPanels || [];
  window.torchyard = ext;

  // ---- job list -----------------------------------------------------------------------------

  function listPage(query) {
    const view = document.getElementById("view");
    const stateSel = h("select", {name: "state", id: "filter-state"},
      h("option", {value: ""}, "any state"),
      STATES.map((s) => h("option", {value: s, selected: query.get("state") === s}, s)));
    const nameIn = h("input", {name: "name", id: "filter-name", placeholder: "name",
                               value: query.get("name") || ""});
    const labelIn = h("input", {name: "label", id: "filter-label", placeholder: "label key=value",
                                value: query.get("label") || ""});
    const form = h("form", {class: "filters", onsubmit: (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      for (const [k, el] of [["state", stateSel], ["name", nameIn], ["label", labelIn]]) {
        if (el.value.trim()) q.set(k, el.value.trim());
      }
      location.hash = `#/?${q}`;
    }}, stateSel, nameIn, labelIn, h("button", {type: "submit"}, "Filter"));
    const tbody = h("tbody", {id: "job-rows"});
    const select = ext.listSelect ? ext.listSelect() : null;  // checkboxes → #/compare
    const table = h("table", {class: "jobs"},
      h("thead", {}, h("tr", {}, select ? h("th", {}, h("span", {class: "sr-only"}, "Select")) : "",
        ["ID", "Name", "State", "Owner", "Team", "Progress", "Age", "Labels"].map(
          (c) => h("th", {}, c)))),
      tbody);
    const empty = h("p", {class: "quiet", hidden: true}, "No jobs match.");
    // Pages by cursor: ?before=<id> in the URL, so a page can be bookmarked.
    const pager = h("nav", {class: "pager", "aria-label": "pages"});
    view.replaceChildren(h("h1", {}, "Jobs"), form, select ? select.bar : "", table, empty, pager);

    const params = new URLSearchParams({limit: "100"});
    for (const k of ["state", "name", "label", "before"]) {
      if (query.get(k)) params.set(k, query.get(k));
    }
    const pageLink = (before, text, id) => {
      const q = new URLSearchParams(query);
      q.delete("before");
      if (before) q.set("before", before);
      return h("a", {href: `#/?${q}`, id}, text);
    };

    return poller(async () => {
      const list = await api(`/jobs?${params}`);
      const jobs = list.items;
      const progress = {};
      if (jobs.length) {
        const q = new URLSearchParams();
        for (const j of jobs) q.append("job_id", j.id);
        for (const p of (await api(`/progress?${q}`)).items) progress[p.job_id] = p;
      }
      showNotice("");
      empty.hidden = jobs.length > 0;
      pager.replaceChildren(query.get("before") ? pageLink(null, "← Newest", "page-newest") : "",
        list.next_before ? pageLink(list.next_before, "Older →", "page-older") : "");
      keepFocus(tbody, () => tbody.replaceChildren(...jobs.map((j) => {
        const epochs = j.spec.epochs;  // absent for script jobs: they have no built-in epoch count
        const reached = (progress[j.id] && progress[j.id].epoch) || 0;
        const done = epochs ? Math.min(epochs, reached) : reached;
        const labels = Object.entries(j.spec.labels || {}).map(
          ([k, v]) => h("span", {class: "label"}, `${k}=${v}`));
        const created = parseTime(j.created_at);
        return h("tr", {"data-job-id": j.id},
          select ? h("td", {}, select.box(j)) : "",
          h("td", {}, h("a", {href: `#/jobs/${j.id}`, "data-focus": `id-${j.id}`}, j.id)),
          h("td", {}, h("a", {href: `#/jobs/${j.id}`, "data-focus": `name-${j.id}`}, j.name)),
          h("td", {}, stateBadge(j.state)),
          h("td", {class: "owner"}, j.owner || ""),
          h("td", {class: "team"}, j.team || ""),
          h("td", {class: "progress"}, epochs
            ? [h("progress", {max: epochs, value: done}), ` ${done} / ${epochs}`]
            : `epoch ${done}`),
          h("td", {title: created ? created.toISOString() : ""},
            created ? duration((Date.now() - created) / 1000) : ""),
          h("td", {}, labels));
      })));
    }, LIST_POLL_MS);
  }

  // ---- one job ------------------------------------------------------------------------------

  const PHASES = [
    ["created_at", "queued"],
    ["started_at", "launched"],
    ["running_at", "rendezvous done"],
    ["first_metric_at", "first metric"],
    ["ended_at", "ended"],
  ];

  function renderPhases(el, job) {
    const rows = [];
    let prev = null;
    for (const [field, label] of PHASES) {
      const t = parseTime(job[field]);
      if (!t) continue;
      rows.push(h("tr", {},
        h("th", {}, label),
        h("td", {}, t.toLocaleString()),
        h("td", {class: "quiet"}, prev ? `+${duration((t - prev) / 1000)}` : "")));
      prev = t;
    }
    const total = parseTime(job.ended_at) || (TERMINAL.has(job.state) ? null : new Date());
    const start = parseTime(job.created_at);
    el.replaceChildren(h("table", {class: "phases"}, rows),
      total && start ? h("p", {class: "quiet"}, `total ${duration((total - start) / 1000)}`) : "");
  }

  function renderAttempts(el, job) {
    if (!job.attempts.length) {
      el.replaceChildren(h("p", {class: "quiet"}, "Not launched yet."));
      return;
    }
    el.replaceChildren(h("table", {class: "attempts"},
      h("thead", {}, h("tr", {}, ["#", "started", "duration", "exit", "reason"].map(
        (c) => h("th", {}, c)))),
      h("tbody", {}, job.attempts.map((a) => h("tr", {},
        h("td", {}, a.number),
        h("td", {}, new Date(a.started_at * 1000).toLocaleTimeString()),
        h("td", {}, duration((a.ended_at || Date.now() / 1000) - a.started_at)),
        h("td", {}, a.exit_code === null ? "" : a.exit_code),
        h("td", {class: "reason"}, a.reason || "", attemptDetails(a)))))));
  }

  // Retry rules' decision and, after a heartbeat timeout, where each rank was (docs/lifecycle.md);
  // the full stacks: GET /jobs/{id}/stacks?attempt=N or `torchyard stacks ID --attempt N`.
  function attemptDetails(a) {
    const lines = [];
    if (a.decision) lines.push(h("div", {class: "quiet decision"}, a.decision.summary));
    if (a.stacks) {
      if (a.stacks.error) lines.push(h("div", {class: "quiet"}, `stacks not taken: ${a.stacks.error}`));
      for (const r of a.stacks.ranks) {
        const state = r.state === "collective" ? `waiting in ${r.collective}`
          : r.state === "elsewhere" ? "not in a collective" : "stacks unknown";
        lines.push(h("div", {class: "quiet stack"},
          `rank ${r.rank}: ${state}${r.where ? `, at ${r.where}` : ""}`));
      }
    }
    return lines.length ? h("div", {class: "attempt-details"}, lines) : "";
  }

  // The job's webhook deliveries (GET /jobs/{id}/deliveries): endpoint names only, never URLs.
  function renderDeliveries(el, items) {
    el.hidden = !items.length;
    if (!items.length) return;
    el.replaceChildren(h("h2", {}, "Webhooks"), h("table", {class: "deliveries"},
      h("thead", {}, h("tr", {}, ["event", "endpoint", "state", "tries", "last answer", "when"]
        .map((c) => h("th", {}, c)))),
      h("tbody", {}, items.map((d) => h("tr", {},
        h("td", {}, d.event),
        h("td", {}, d.endpoint),
        h("td", {}, d.state),
        h("td", {}, d.attempts),
        h("td", {class: "reason"}, d.last_status_code !== null ? `HTTP ${d.last_status_code}`
                                   : (d.last_error || "")),
        h("td", {}, (parseTime(d.delivered_at || d.last_attempt_at || d.created_at))
          .toLocaleTimeString()))))));
  }

  function toNumber(v) {
    return typeof v === "number" ? v : null;  // "NaN"/"Infinity" are gaps in the line
  }

  function span(s) {
    const xs = s.mean.x;
    return xs.length ? xs[xs.length - 1] - xs[0] : 0;
  }

  function drawChart(el, noteEl, s) {
    const multiAttempt = s.attempts.length > 1;
    const traces = s.lines.map((line) => ({
      type: "scatter",
      mode: line.x.length > 60 ? "lines" : "lines+markers",
      name: multiAttempt ? `rank ${line.rank} · attempt ${line.attempt}` : `rank ${line.rank}`,
      legendgroup: `rank ${line.rank}`,
      meta: {kind: "rank", rank: line.rank, attempt: line.attempt},
      x: line.x,
      y: line.y.map(toNumber),
      line: {color: PALETTE[line.rank % PALETTE.length], width: 1.5,
             dash: DASHES[(line.attempt - 1) % DASHES.length]},
      marker: {size: 4},
    }));
    if (s.mean.x.length) {
      traces.push({type: "scatter", mode: "lines", name: "mean", meta: {kind: "mean"},
                   x: s.mean.x, y: s.mean.y.map(toNumber), line: {color: "#111", width: 3}});
    }
    const restarts = s.attempts.filter((a) => a.number > 1);
    const layout = {
      uirevision: `${s.job_id}:${s.name}:${s.level}`,  // keep the user's zoom across updates
      margin: {l: 60, r: 20, t: 30, b: 95},  // room for the legend below the axis title
      // Whole epochs on the axis while there are few of them (no "epoch 1.5" ticks).
      xaxis: {title: {text: s.level}, dtick: span(s) <= 12 ? 1 : undefined},
      yaxis: {title: {text: s.name}},
      legend: {orientation: "h", yref: "container", y: 0, yanchor: "bottom"},
      shapes: restarts.map((a) => ({type: "line", xref: "x", yref: "paper", x0: a.first_x,
                                    x1: a.first_x, y0: 0, y1: 1,
                                    line: {color: "#888", dash: "dot", width: 1}})),
      annotations: restarts.map((a) => ({x: a.first_x, xref: "x", y: 1, yref: "paper",
                                         yanchor: "bottom", showarrow: false,
                                         text: `attempt ${a.number}`})),
    };
    window.Plotly.react(el, traces, layout, {responsive: true, displaylogo: false});
    el.dataset.updates = String(Number(el.dataset.updates || 0) + 1);

    const notes = [];
    const shown = s.lines.reduce((n, l) => n + l.x.length, 0);
    const total = s.lines.reduce((n, l) => n + l.points, 0);
    if (shown < total) {
      notes.push(`Showing ${shown} of ${total} points (downsampled; first, last and extreme ` +
                 "points kept).");
    }
    const nonfinite = s.lines.filter((l) => l.y.some((v) => typeof v !== "number"));
    if (nonfinite.length) {
      notes.push("Non-finite values (gaps in the line): " + nonfinite.map((l) => {
        const i = l.y.findIndex((v) => typeof v !== "number");
        return `rank ${l.rank} attempt ${l.attempt}: ${l.y[i]} at ${s.level} ${l.x[i]}`;
      }).join("; ") + ".");
    }
    if (!s.lines.length) notes.push(`No "${s.name}" records yet.`);
    noteEl.textContent = notes.join(" ");
  }

  function renderDivergence(el, summary) {
    const flagged = (summary.items || []).filter((i) => (i.diverged_ranks || []).length);
    if (!flagged.length) {
      el.replaceChildren(h("p", {class: "quiet"}, "No rank diverges from the others."));
      return;
    }
    const threshold = summary.threshold === undefined ? "" : ` (threshold ${summary.threshold})`;
    el.replaceChildren(
      h("p", {class: "warn"}, `Ranks diverge from the others${threshold}:`),
      h("ul", {class: "divergence"}, flagged.map((i) => h("li", {},
        `epoch ${i.epoch}: rank ${i.diverged_ranks.join(", rank ")}`))));
  }

  // Everything the rank printed (stdout and stderr in the order written) unless one stream is
  // picked; followed live from its tail (a long log is not read from the start); earlier parts
  // load on demand, LOG_PAGE_BYTES at a time.
  function logsPanel(jobId, container) {
    const rankSel = h("select", {id: "log-rank"});
    const streamSel = h("select", {id: "log-stream"},
      h("option", {value: "combined"}, "stdout + stderr"),
      h("option", {value: "stdout"}, "stdout"),
      h("option", {value: "stderr"}, "stderr"));
    const pre = h("pre", {class: "log", id: "log-text"});
    const note = h("p", {class: "quiet", id: "log-note"});
    const earlierBtn = h("button", {type: "button", id: "log-earlier", class: "quiet",
                                    hidden: true}, "Load earlier");
    container.replaceChildren(h("div", {class: "row"}, h("label", {}, "rank ", rankSel),
                                h("label", {}, " output ", streamSel), earlierBtn),
                              note, pre);
    let ranks = 0;
    let offset = null;  // null: not read yet, start at the tail
    let first = 0;  // byte offset of the first text shown
    let attempt = null;
    let jobState = "queued";
    let available = true;
    let earlierLoaded = false;

    function reset() {
      offset = null;
      first = 0;
      attempt = null;
      earlierLoaded = false;
      earlierBtn.hidden = true;
      pre.textContent = "";
      note.textContent = "";
    }
    for (const sel of [rankSel, streamSel]) {
      sel.addEventListener("change", () => { reset(); poll.stop(); poll = start(); });
    }

    earlierBtn.addEventListener("click", async () => {
      if (first <= 0 || attempt === null) return;
      const from = Math.max(0, first - LOG_PAGE_BYTES);
      earlierBtn.disabled = true;
      try {
        const r = await api(`/jobs/${jobId}/logs?` + new URLSearchParams({
          rank: rankSel.value, attempt: String(attempt), offset: String(from),
          limit: String(first - from),
          ...(streamSel.value !== "combined" ? {stream: streamSel.value} : {})}));
        const keep = pre.scrollHeight - pre.scrollTop;  // stay on the same lines
        pre.textContent = r.text + pre.textContent;
        pre.scrollTop = pre.scrollHeight - keep;
        first = r.offset;
        earlierLoaded = true;
        earlierBtn.hidden = first <= 0;
      } catch (err) {
        reportError(err);
      } finally {
        earlierBtn.disabled = false;
      }
    });

    const start = () => poller(async () => {
      if (rankSel.value === "") return true;
      const params = {rank: rankSel.value};
      if (offset === null) params.tail = String(LOG_PAGE_BYTES);
      else params.offset = String(offset);
      let r;
      try {
        if (streamSel.value !== "combined") params.stream = streamSel.value;
        r = await api(`/jobs/${jobId}/logs?` + new URLSearchParams(params));
      } catch (err) {
        if (err instanceof ApiFailure && err.status === 404) {
          available = false;
          note.textContent = "Logs are not available for this rank (yet).";
          return !TERMINAL.has(jobState);
        }
        throw err;
      }
      available = true;
      if (attempt !== null && r.attempt !== attempt) {  // a new attempt: its own log file
        reset();
        return true;
      }
      if (offset === null) {
        first = r.offset;
        earlierBtn.hidden = first <= 0;
      }
      attempt = r.attempt;
      note.textContent = `attempt ${r.attempt}` + (r.complete ? " · complete" : "") +
        (streamSel.value === "combined" && r.stream !== "combined" ? ` · ${r.stream} only` : "");
      if (r.text) {
        const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        let text = pre.textContent + r.text;
        if (!earlierLoaded && text.length > LOG_CAP_CHARS) {
          text = text.slice(text.length - LOG_CAP_CHARS);
          first = -1;  // the start of what is shown is no longer a known offset
          earlierBtn.hidden = true;
        }
        pre.textContent = text;
        if (atBottom) pre.scrollTop = pre.scrollHeight;
      }
      offset = r.next_offset;
      return !(r.complete && TERMINAL.has(jobState));
    }, () => (available ? POLL_MS : 3 * POLL_MS));
    let poll = {stop() {}};

    return {
      update(job) {
        jobState = job.state;
        const n = job.spec.nproc_per_node;
        if (n !== ranks) {
          ranks = n;
          rankSel.replaceChildren(...Array.from({length: n}, (_, i) => h("option", {value: i}, i)));
          reset();
          poll.stop();
          poll = start();
        }
      },
      stop() { poll.stop(); },
    };
  }

  function jobPage(jobId) {
    loadPlotly().catch(() => {});  // in parallel with the first reads; awaited before drawing
    const view = document.getElementById("view");
    const title = h("h1", {}, `Job ${jobId}`);
    const badge = h("span", {id: "job-state"});
    const cancelBtn = h("button", {type: "button", id: "cancel-button", class: "danger",
                                   hidden: true}, "Cancel job");
    // Pause: the ranks checkpoint and the job's slots come free; Resume queues it again.
    const pauseBtn = h("button", {type: "button", id: "pause-button", hidden: true}, "Pause");
    const resumeBtn = h("button", {type: "button", id: "resume-button", hidden: true}, "Resume");
    const reason = h("p", {class: "reason", id: "job-reason"});
    // retry_elsewhere on Slurm: the nodes the job's restarts leave out (docs/lifecycle.md).
    const excluded = h("p", {class: "quiet", id: "job-excluded", hidden: true});
    const phases = h("div", {id: "phases"});
    const attempts = h("div", {id: "attempts"});
    const metricSel = h("select", {id: "metric-name"}, h("option", {value: "loss"}, "loss"));
    const chart = h("div", {id: "chart", class: "chart"});
    const chartNote = h("p", {class: "quiet", id: "chart-note"});
    const divergence = h("div", {id: "divergence"},
      h("p", {class: "quiet"}, "Waiting for metrics."));
    const logs = h("div", {id: "logs"});
    const deliveries = h("section", {id: "deliveries", hidden: true});
    const panels = ext.jobPanels.map((make) => make(jobId));  // jobextras.js: sweep, outputs, spec
    view.replaceChildren(
      h("div", {class: "job-head"}, title, badge, h("span", {class: "spacer"}), pauseBtn,
        resumeBtn, cancelBtn),
      reason,
      excluded,
      ...panels.map((p) => p.top).filter(Boolean),
      h("section", {class: "chart-section"},
        h("div", {class: "row"}, h("h2", {}, "Per-rank curves"),
          h("label", {}, "metric ", metricSel)),
        chart, chartNote),
      h("div", {class: "columns"},
        h("section", {}, h("h2", {}, "Phases"), phases),
        h("section", {}, h("h2", {}, "Divergence"), divergence),
        h("section", {}, h("h2", {}, "Attempts"), attempts)),
      deliveries,
      ...panels.map((p) => p.section).filter(Boolean),
      h("section", {}, h("h2", {}, "Logs"), logs));

    let job = null;
    let shown = null;  // {seq, state, name} of the series on screen
    const levels = {};  // metric name → "step" once a metric turned out to be per-step only
    const logPanel = logsPanel(jobId, logs);

    cancelBtn.addEventListener("click", async () => {
      if (!window.confirm(`Cancel job ${jobId}?`)) return;
      cancelBtn.disabled = true;
      try {
        const updated = await api(`/jobs/${jobId}/cancel`, {method: "POST"});
        badge.replaceChildren(stateBadge(updated.state));
      } catch (err) {
        reportError(err);
      } finally {
        cancelBtn.disabled = false;
      }
    });

    for (const [button, action] of [[pauseBtn, "pause"], [resumeBtn, "resume"]]) {
      button.addEventListener("click", async () => {
        button.disabled = true;
        try {
          const updated = await api(`/jobs/${jobId}/${action}`, {method: "POST"});
          badge.replaceChildren(stateBadge(updated.state));
          pauseBtn.hidden = !canControl() || !PAUSABLE.has(updated.state);
          resumeBtn.hidden = !canControl() || updated.state !== "paused";
        } catch (err) {
          reportError(err);
        } finally {
          button.disabled = false;
        }
      });
    }

    async function refreshSummary(name) {
      try {
        renderDivergence(divergence, await api(
          `/jobs/${jobId}/metrics/summary?${new URLSearchParams({name})}`));
      } catch (err) {
        if (!(err instanceof ApiFailure) || err.status === 401) throw err;
        // Older servers have no summary route (404); say so quietly.
        divergence.replaceChildren(h("p", {class: "quiet"},
          err.status === 404 ? "Cross-rank summary not available." : err.message));
      }
    }

    const tick = async () => {
      job = await api(`/jobs/${jobId}`);
      showNotice("");
      title.textContent = `Job ${job.id} · ${job.name}`;
      badge.replaceChildren(stateBadge(job.state));
      cancelBtn.hidden = !canControl() || TERMINAL.has(job.state);
      pauseBtn.hidden = !canControl() || !PAUSABLE.has(job.state);
      resumeBtn.hidden = !canControl() || job.state !== "paused";
      reason.textContent = job.reason || "";
      const nodes = job.exclude_nodes || [];  // absent from an older server's answer
      excluded.hidden = !nodes.length;
      excluded.textContent = nodes.length ? `Excluded nodes: ${nodes.join(", ")}` : "";
      renderPhases(phases, job);
      renderAttempts(attempts, job);
      logPanel.update(job);
      for (const p of panels) p.update(job);
      try {
        renderDeliveries(deliveries, (await api(`/jobs/${jobId}/deliveries`)).items);
      } catch (err) {  // an older server has no such route (404): nothing to show
        if (!(err instanceof ApiFailure) || err.status === 401) throw err;
      }

      const name = metricSel.value || "loss";
      const progress = (await api(`/progress?job_id=${jobId}`)).items[0];
      const changed = !shown || shown.seq !== progress.last_seq || shown.name !== name ||
                      shown.state !== job.state;
      if (changed) {
        const series = (level) => api(`/jobs/${jobId}/series?` + new URLSearchParams(
          {name, level, max_points: String(SERIES_MAX_POINTS)}));
        // Per-epoch records when the job reports them; a job that reports only per-step
        // records is charted by step (remembered per metric).
        let s = await series(levels[name] || "epoch");
        if (!s.lines.length && !levels[name]) {
          const steps = await series("step");
          if (steps.lines.length) {
            s = steps;
            levels[name] = "step";
          }
        }
        shown = {seq: s.last_seq, state: job.state, name};
        const names = s.names.includes(name) ? s.names : [name, ...s.names];
        if (names.join() !== Array.from(metricSel.options, (o) => o.value).join()) {
          metricSel.replaceChildren(...names.map(
            (n) => h("option", {value: n, selected: n === name}, n)));
        }
        await loadPlotly();
        drawChart(chart, chartNote, s);
        if (s.lines.length) await refreshSummary(name);
      }
      // Once terminal, drawn from a terminal read and every attempt over, nothing changes any
      // more (a cancelled or guard-stopped job is terminal while its group is still stopping).
      const ended = parseTime(job.ended_at);
      const over = job.attempts.every((a) => a.ended_at !== null) ||
                   (ended !== null && Date.now() - ended > 60_000);
      return !(TERMINAL.has(job.state) && !changed && over);
    };
    let poll = poller(tick, POLL_MS);
    metricSel.addEventListener("change", () => {  // the poller may have stopped (terminal job)
      shown = null;
      poll.stop();
      poll = poller(tick, POLL_MS);
    });

    return {stop() { poll.stop(); logPanel.stop(); for (const p of panels) p.stop(); }};
  }

  // ---- submit -------------------------------------------------------------------------------

  function submitPage(query) {
    const view = document.getElementById("view");
    const heading = h("h1", {}, "Submit a job");
    if (!canControl()) {
      view.replaceChildren(heading,
        h("p", {class: "quiet"}, `${me.user} is a viewer: viewers read their team's jobs but ` +
          "cannot submit."));
      return {stop() {}};
    }
    const text = h("textarea", {id: "spec-json", rows: 16, spellcheck: "false"});
    text.value = JSON.stringify(DEFAULT_SPEC, null, 2);
    const errors = h("div", {id: "submit-errors", class: "warn"});
    const form = h("form", {class: "submit", onsubmit: async (ev) => {
      ev.preventDefault();
      errors.replaceChildren();
      let spec;
      try {
        spec = JSON.parse(text.value);
      } catch (err) {
        errors.replaceChildren(h("p", {}, `Not valid JSON: ${err.message}`));
        return;
      }
      try {
        const job = await api("/jobs", {method: "POST", json: spec});
        location.hash = `#/jobs/${job.id}`;
      } catch (err) {
        const details = (err.body && err.body.details) || [];
        errors.replaceChildren(h("p", {}, err.message),
          h("ul", {}, details.map((d) => h("li", {}, `${d.field}: ${d.message}`))));
      }
    }}, h("label", {for: "spec-json"}, "Job spec (JSON; see docs/spec.md)"),
      text, h("div", {}, h("button", {type: "submit", id: "submit-button"}, "Submit")), errors);
    view.replaceChildren(heading, form);
    const from = query.get("copy");  // "Submit a copy" on a job's page
    if (from && ext.copiedSpec) {
      ext.copiedSpec(from).then((spec) => {
        text.value = JSON.stringify(spec, null, 2);
        heading.textContent = `Submit a copy of job ${from}`;
      }).catch(reportError);
    }
    return {stop() {}};
  }

  // ---- routing and start-up -----------------------------------------------------------------

  let page = null;

  function route() {
    if (page) page.stop();
    showNotice("");
    const hash = location.hash || "#/";
    const [path, search] = [hash.split("?")[0], hash.split("?")[1] || ""];
    const query = new URLSearchParams(search);
    for (const a of document.querySelectorAll("header nav a")) {
      const here = a.getAttribute("href") === (path === "#/" || path.startsWith("#/jobs") ? "#/"
        : `#/${path.split("/")[1]}`);
      if (here) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    for (const r of ext.routes) {
      const m = path.match(r.path);
      if (m) {
        page = r.page(m, query);
        return;
      }
    }
    const job = path.match(/^#\/jobs\/(\d+)$/);
    if (job) page = jobPage(Number(job[1]));
    else if (path === "#/submit") page = submitPage(query);
    else page = listPage(query);
  }

  function setUpToken() {
    const form = document.getElementById("token-form");
    const input = document.getElementById("token-input");
    document.getElementById("token-button").addEventListener("click", () => {
      form.hidden = !form.hidden;
      document.getElementById("token-message").textContent =
        localStorage.getItem(TOKEN_KEY) ? "API token (one is saved)" : "API token";
    });
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      if (input.value.trim()) localStorage.setItem(TOKEN_KEY, input.value.trim());
      input.value = "";
      form.hidden = true;
      await refreshMe();
      route();
    });
    const forget = async () => {  // "Forget" in the form, "Sign out" in the header
      localStorage.removeItem(TOKEN_KEY);
      me = null;
      form.hidden = true;
      showWho();
      if (page) page.stop();
      document.getElementById("view").replaceChildren(
        h("p", {class: "quiet", id: "signed-out"}, "Signed out: the token is forgotten."));
      askForToken("Signed out. Paste a token to sign in again.");
    };
    document.getElementById("token-clear").addEventListener("click", forget);
    document.getElementById("sign-out").addEventListener("click", forget);
  }

  setUpToken();
  window.addEventListener("hashchange", route);
  // Once every deferred file ran (DOMContentLoaded comes after them): their routes and panels
  // are registered by then; who is signed in (GET /me) is known before the first page draws.
  document.addEventListener("DOMContentLoaded", () => { refreshMe().finally(route); });
})();
