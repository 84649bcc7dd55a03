// Sweeps (docs/sweeps.md, docs/dashboard.md):
//   #/sweeps[?state=&before=]   the list: name, state, trials by outcome, best value, age
//   #/sweeps/<id>               one sweep: its trials (sortable, best highlighted), the objective
//                               per epoch of every trial on one chart, params → value as
//                               parallel coordinates and as a scatter of one parameter; cancel;
//                               compare its trials; live while it runs
// One read per refresh: GET /sweeps/{id}/series (every trial's row and its objective per epoch,
// downsampled on the server), so a sweep of 200 long trials draws at once.
"use strict";

(() => {
  const ty = window.torchyard;
  const {h, api} = ty;
  const SWEEP_STATES = ["running", "succeeded", "failed", "cancelled"];
  const OUTCOMES = ["completed", "pruned", "failed", "cancelled", "running", "queued"];
  const POINTS_BUDGET = 20_000;  // chart points for the whole sweep, shared by its trials
  const COMPARE_MAX = 10;

  function countsText(counts) {
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    const parts = OUTCOMES.filter((k) => counts[k]).map((k) => `${counts[k]} ${k}`);
    return `${total}` + (parts.length ? ` (${parts.join(" · ")})` : "");
  }

  // ---- the list -----------------------------------------------------------------------------

  function sweepsPage(_match, query) {
    const view = document.getElementById("view");
    const stateSel = h("select", {id: "sweep-state", "aria-label": "state"},
      h("option", {value: ""}, "any state"),
      SWEEP_STATES.map((s) => h("option", {value: s, selected: query.get("state") === s}, s)));
    stateSel.addEventListener("change", () => {
      location.hash = stateSel.value ? `#/sweeps?state=${stateSel.value}` : "#/sweeps";
    });
    const holder = h("div", {id: "sweeps-table"});
    const empty = h("p", {class: "quiet", hidden: true}, "No sweeps (POST /sweeps, docs/sweeps.md).");
    const pager = h("nav", {class: "pager", "aria-label": "pages"});
    view.replaceChildren(h("h1", {}, "Sweeps"), h("div", {class: "filters"}, stateSel), holder,
                         empty, pager);
    const params = new URLSearchParams({limit: "50"});
    for (const k of ["state", "before"]) if (query.get(k)) params.set(k, query.get(k));
    const pageLink = (before, text, id) => {
      const q = new URLSearchParams(query);
      q.delete("before");
      if (before) q.set("before", before);
      return h("a", {href: `#/sweeps?${q}`, id}, text);
    };

    return ty.poller(async () => {
      const list = await api(`/sweeps?${params}`);
      const rows = list.items;
      const who = ty.people(rows);
      empty.hidden = rows.length > 0;
      pager.replaceChildren(query.get("before") ? pageLink(null, "← Newest", "sweeps-newest") : "",
        list.next_before ? pageLink(list.next_before, "Older →", "sweeps-older") : "");
      const table = h("table", {class: "grid", id: "sweeps"},
        h("thead", {}, h("tr", {}, ["ID", "Name", "State", "Trials", "Best", ...who, "Age"].map(
          (c) => h("th", {}, c)))),
        h("tbody", {}, rows.map((s) => h("tr", {"data-sweep-id": s.id},
          h("td", {}, h("a", {href: `#/sweeps/${s.id}`, "data-focus": `sweep-${s.id}`}, s.id)),
          h("td", {}, h("a", {href: `#/sweeps/${s.id}`, "data-focus": `sname-${s.id}`}, s.name)),
          h("td", {}, ty.stateBadge(s.state)),
          h("td", {}, countsText(s.counts)),
          h("td", {class: "best-cell"}, s.best
            ? [ty.fmtValue(s.best.value), " ", h("a", {href: `#/jobs/${s.best.job_id}`,
                "data-focus": `sbest-${s.id}`}, `(job ${s.best.job_id})`)] : ""),
          who.map((k) => h("td", {}, ty.personCell(s[k]))),
          ty.timeCell(s.created_at)))));
      ty.keepFocus(holder, () => holder.replaceChildren(rows.length ? ty.scroller(table) : ""));
      ty.showNotice("");
    }, ty.LIST_POLL_MS);
  }

  // ---- one sweep ----------------------------------------------------------------------------

  function isLog(dim) {
    return !!dim && (dim.type === "log_uniform" || (dim.type === "int" && dim.log));
  }

  function outcomeText(t) {
    if (t.outcome === "pruned") {
      return t.pruned_epoch !== null ? `pruned at epoch ${t.pruned_epoch}` : "pruned";
    }
    return t.outcome || t.state;
  }

  function defaultPick(trials, mode) {
    const done = trials.filter((t) => typeof t.value === "number");
    done.sort((a, b) => (mode === "max" ? b.value - a.value : a.value - b.value));
    const rest = trials.filter((t) => typeof t.value !== "number");
    return new Set([...done, ...rest].slice(0, COMPARE_MAX).map((t) => t.job_id));
  }

  // Up to PER_TRIAL_MAX trials: a line (and a legend entry) each. More: one line per outcome,
  // the trials joined by gaps (plotly draws a trace per trace: 200 of them take seconds), and
  // the best trial on its own; hovering a point still names its trial.
  const PER_TRIAL_MAX = 20;
  const GROUPS = [["completed", "completed", "#1f77b4", "solid"], ["pruned", "pruned", "#9467bd", "dot"],
                  ["ended", "failed or cancelled", "#d62728", "dash"], ["live", "running", "#2ca02c", "solid"]];

  function groupOf(t) {
    if (t.outcome === "completed" || t.outcome === "pruned") return t.outcome;
    return t.outcome ? "ended" : "live";
  }

  function objectiveTraces(trials, bestId) {
    const drawn = trials.filter((t) => t.x.length);
    const one = (t, color, width) => ({
      type: "scatter", mode: t.x.length > 40 ? "lines" : "lines+markers",
      name: `trial ${t.job_id}` + (t.outcome === "pruned" ? " (pruned)" : ""),
      meta: {kind: "trial", job_id: t.job_id, outcome: t.outcome, pruned_epoch: t.pruned_epoch},
      x: t.x, y: t.y.map(ty.toNumber),
      line: {color, width, dash: t.outcome === "pruned" ? "dot" : "solid"},
      marker: {size: 5, symbol: t.x.map((_, k) => (
        t.outcome === "pruned" && k === t.x.length - 1 ? "x" : "circle"))},
    });
    if (drawn.length <= PER_TRIAL_MAX) {
      return drawn.map((t, i) => one(t, ty.PALETTE[i % ty.PALETTE.length], t.job_id === bestId ? 4 : 1.5));
    }
    const traces = GROUPS.map(([key, label, color, dash]) => {
      const members = drawn.filter((t) => groupOf(t) === key && t.job_id !== bestId);
      const join = (f) => members.flatMap((t) => [...f(t), null]);
      return {
        type: "scatter", mode: "lines", name: `${label} (${members.length})`, connectgaps: false,
        meta: {kind: "group", group: key, trials: members.map((t) => t.job_id)},
        x: join((t) => t.x), y: join((t) => t.y.map(ty.toNumber)),
        text: join((t) => t.x.map(() => `trial ${t.job_id}`)),
        hovertemplate: "%{text}<br>epoch %{x}: %{y}<extra></extra>",
        line: {color, width: 1, dash}, opacity: 0.6,
      };
    }).filter((t) => t.meta.trials.length);
    const best = drawn.find((t) => t.job_id === bestId);
    if (best) traces.push({...one(best, "#111", 3), name: `best: trial ${best.job_id}`});
    return traces;
  }

  // Parallel coordinates, drawn as SVG lines (plotly's parcoords needs WebGL, which many
  // browsers and every headless one lack): one vertical axis per parameter (a log-uniform one on
  // log10; a choice of strings or booleans by index), then the objective; one line per completed
  // trial, coloured by its value (Viridis, the best brightest).
  function parcoordsFigure(trials, names, space, objective) {
    const done = trials.filter((t) => typeof t.value === "number");
    const axes = names.map((n) => ty.axisOf(n, done.map((t) => t.params[n]), isLog(space[n])));
    axes.push(ty.axisOf(`${objective.metric} (${objective.mode})`, done.map((t) => t.value), false));
    const norm = (a, v) => (a.hi === a.lo ? 0.5 : (v - a.lo) / (a.hi - a.lo));
    const last = axes[axes.length - 1];
    const better = (v) => (objective.mode === "min" ? 1 - norm(last, v) : norm(last, v));
    const xs = axes.map((_, k) => k);
    // One trace per colour band (8 of them), the trials' lines joined by gaps: plotly's cost is
    // per trace, and 200 trials are 200 traces otherwise.
    const BANDS = 8;
    const band = (t) => Math.min(BANDS - 1, Math.floor(better(t.value) * BANDS));
    const traces = Array.from({length: BANDS}, (_, b) => {
      const members = done.map((t, i) => ({t, i})).filter(({t}) => band(t) === b);
      const hover = ({t}) => `trial ${t.job_id}<br>` + names.map(
        (n) => `${n} = ${ty.fmtValue(t.params[n])}`).join("<br>") +
        `<br>${objective.metric} = ${ty.fmtValue(t.value)}`;
      return {
        type: "scatter", mode: "lines", showlegend: false,
        meta: {kind: "lines", trials: members.map(({t}) => t.job_id)},
        x: members.flatMap(() => [...xs, null]),
        y: members.flatMap(({i}) => [...axes.map((a) => norm(a, a.values[i])), null]),
        text: members.flatMap((m) => [...xs.map(() => hover(m)), null]),
        hovertemplate: "%{text}<extra></extra>",
        line: {color: ty.viridis((b + 0.5) / BANDS), width: 2},
      };
    }).filter((t) => t.meta.trials.length);
    traces.push({  // the objective's points, with the colour bar
      type: "scatter", mode: "markers", showlegend: false, hoverinfo: "skip",
      meta: {kind: "value", dims: axes.map((a) => a.label)},
      x: done.map(() => axes.length - 1), y: done.map((t) => norm(last, t.value)),
      marker: {size: 8, color: done.map((t) => t.value), colorscale: "Viridis",
               reversescale: objective.mode === "min", showscale: true,
               colorbar: {thickness: 12, title: {text: objective.metric}}},
    });
    const text = (x, y, s, extra) => ({x, y, xref: "x", yref: "y", text: s, showarrow: false,
                                       font: {size: 11}, ...extra});
    return {traces, layout: {
      margin: {l: 20, r: 20, t: 40, b: 20}, hovermode: "closest",
      xaxis: {visible: false, range: [-0.4, axes.length - 0.6], fixedrange: true},
      yaxis: {visible: false, range: [-0.08, 1.12], fixedrange: true},
      shapes: xs.map((x) => ({type: "line", x0: x, x1: x, y0: 0, y1: 1, xref: "x", yref: "y",
                               line: {color: "#667085", width: 1}})),
      annotations: axes.flatMap((a, k) => [
        text(k, 1.1, `<b>${a.label}</b>`),
        ...a.ticks.map(([v, s]) => text(k, norm(a, v), s, {xanchor: "right", xshift: -4})),
      ]),
    }};
  }

  function scatterTraces(trials, name) {
    const point = (t) => ({x: t.params[name], y: t.value});
    const last = (t) => ({x: t.params[name], y: ty.toNumber(t.y[t.y.length - 1])});
    const done = trials.filter((t) => typeof t.value === "number").map((t) => ({t, ...point(t)}));
    const pruned = trials.filter((t) => t.outcome === "pruned" && t.y.length)
      .map((t) => ({t, ...last(t)}));
    const trace = (pts, label, symbol, kind) => ({
      type: "scatter", mode: "markers", name: label, meta: {kind},
      x: pts.map((p) => p.x), y: pts.map((p) => p.y), text: pts.map((p) => `trial ${p.t.job_id}`),
      marker: {size: 9, symbol},
    });
    return [trace(done, "completed", "circle", "completed"),
            trace(pruned, "pruned (value when stopped)", "x", "pruned")];
  }

  function sweepPage(match) {
    ty.loadPlotly().catch(() => {});  // while the sweep is read
    const id = Number(match[1]);
    const view = document.getElementById("view");
    const title = h("h1", {}, `Sweep ${id}`);
    const badge = h("span", {id: "sweep-state-badge"});
    const cancelBtn = h("button", {type: "button", id: "sweep-cancel", class: "danger", hidden: true},
                        "Cancel sweep");
    const compareBtn = h("button", {type: "button", id: "sweep-compare"}, "Compare selected");
    const summary = h("p", {id: "sweep-summary"});
    const reason = h("p", {class: "reason", id: "sweep-reason"});
    const trialsBox = h("div", {id: "trials"});
    const objChart = h("div", {id: "sweep-chart", class: "chart"});
    const pcChart = h("div", {id: "sweep-parcoords", class: "chart"});
    const scChart = h("div", {id: "sweep-scatter", class: "chart"});
    const scParam = h("select", {id: "scatter-param", "aria-label": "parameter"});
    const pcNote = h("p", {class: "quiet", id: "parcoords-note"});
    view.replaceChildren(
      h("div", {class: "job-head"}, title, badge, h("span", {class: "spacer"}), compareBtn, cancelBtn),
      summary, reason,
      h("section", {}, h("h2", {}, "Trials"), trialsBox),
      h("section", {}, h("h2", {}, "Objective per epoch"), objChart),
      h("div", {class: "columns"},
        h("section", {}, h("h2", {}, "Parameters → objective"), pcNote, pcChart),
        h("section", {}, h("div", {class: "row"}, h("h2", {}, "One parameter"),
          h("label", {}, "parameter ", scParam)), scChart)));

    const sort = {key: "job_id", dir: 1};
    let data = null;
    let picked = null;  // job ids ticked by the user; null: the default (best ones)
    let shown = "";  // what the charts were drawn from
    let maxPoints = POINTS_BUDGET / 200;  // per trial; fitted to the sweep once it is read

    function trialColumns(sweep, names) {
      const bestId = sweep.best ? sweep.best.job_id : null;
      const pick = picked || defaultPick(data.trials, sweep.spec.objective.mode);
      return [
        {key: "pick", label: h("span", {class: "sr-only"}, "compare"), sortable: false,
         cell: (t) => h("input", {type: "checkbox", checked: pick.has(t.job_id),
           "aria-label": `compare trial ${t.job_id}`, "data-focus": `pick-${t.job_id}`,
           onchange: (ev) => {
             if (!picked) picked = new Set(pick);
             if (ev.target.checked) picked.add(t.job_id);
             else picked.delete(t.job_id);
           }})},
        {key: "job_id", label: "trial", cell: (t) => [
          h("a", {href: `#/jobs/${t.job_id}`, "data-focus": `trial-${t.job_id}`}, `job ${t.job_id}`),
          t.job_id === bestId ? h("span", {class: "best-badge"}, " best") : ""]},
        ...names.map((n) => ({key: `p:${n}`, label: n, value: (t) => t.params[n],
                              cell: (t) => ty.fmtValue(t.params[n])})),
        {key: "state", label: "state", cell: (t) => ty.stateBadge(t.state)},
        {key: "outcome", label: "outcome", value: outcomeText, cell: (t) => h("span", {
          class: t.outcome === "pruned" ? "pruned" : "", title: t.reason || ""}, outcomeText(t))},
        {key: "value", label: `${sweep.spec.objective.metric} (${sweep.spec.objective.mode})`,
         cell: (t) => ty.fmtValue(t.value)},
        {key: "epochs", label: "epochs", value: (t) => t.x.length ? t.x[t.x.length - 1] : null,
         cell: (t) => (t.x.length ? t.x[t.x.length - 1] : "")},
      ];
    }

    function drawTable() {
      const {sweep, trials} = data;
      const names = Object.keys(sweep.spec.space).sort();
      const bestId = sweep.best ? sweep.best.job_id : null;
      const table = ty.sortableTable({
        id: "trials-table", columns: trialColumns(sweep, names), rows: trials, state: sort,
        redraw: drawTable,
        rowAttrs: (t) => ({"data-job-id": t.job_id, class: t.job_id === bestId ? "best" : null}),
      });
      ty.keepFocus(trialsBox, () => trialsBox.replaceChildren(
        trials.length ? ty.scroller(table) : h("p", {class: "quiet"}, "No trials yet.")));
    }

    function drawCharts() {
      const {sweep, trials} = data;
      const names = Object.keys(sweep.spec.space).sort();
      const objective = sweep.spec.objective;
      ty.plot(objChart, objectiveTraces(trials, sweep.best ? sweep.best.job_id : null), {
        uirevision: `sweep-${id}`, showlegend: trials.length <= 20,
        // Whole epochs on the axis while there are few of them (as on a job's page).
        xaxis: {title: {text: "epoch"}, dtick: Math.max(0, ...trials.map((t) => t.x[t.x.length - 1] || 0)) <= 12
          ? 1 : undefined},
        yaxis: {title: {text: objective.metric}},
      });
      const done = trials.filter((t) => typeof t.value === "number").length;
      pcNote.textContent = done ? `${done} completed trial(s), one line each.`
        : "No completed trial yet.";
      const pc = done ? parcoordsFigure(trials, names, sweep.spec.space, objective)
        : {traces: [], layout: {}};
      ty.plot(pcChart, pc.traces, pc.layout);
      if (Array.from(scParam.options, (o) => o.value).join() !== names.join()) {
        scParam.replaceChildren(...names.map((n) => h("option", {value: n}, n)));
      }
      const name = scParam.value || names[0];
      const xs = trials.map((t) => t.params[name]);
      const numeric = xs.every((v) => typeof v === "number");
      ty.plot(scChart, scatterTraces(trials, name), {
        uirevision: `scatter-${id}-${name}`,
        xaxis: {title: {text: name}, type: isLog(sweep.spec.space[name]) ? "log"
          : numeric ? "linear" : "category"},
        yaxis: {title: {text: objective.metric}},
      });
    }

    function draw() {
      const {sweep, trials} = data;
      title.textContent = `Sweep ${sweep.id} · ${sweep.name}`;
      badge.replaceChildren(ty.stateBadge(sweep.state));
      cancelBtn.hidden = sweep.state !== "running" || !ty.canControl();
      const spec = sweep.spec;
      const rule = spec.prune ? `, pruned by ${spec.prune.type}` : "";
      summary.replaceChildren(
        `${spec.method} search of ${Object.keys(spec.space).length} parameter(s)${rule}; ` +
        `${spec.objective.mode} ${spec.objective.metric} (${spec.objective.reduce} over ranks). ` +
        `Trials: ${countsText(sweep.counts)}. `,
        sweep.best ? h("span", {}, "Best: ", h("a", {href: `#/jobs/${sweep.best.job_id}`,
          id: "sweep-best"}, `job ${sweep.best.job_id}`), ` = ${ty.fmtValue(sweep.best.value)}.`)
          : "No best yet.",
        ...ty.people([sweep]).map((k) => ` ${k}: ${ty.personCell(sweep[k])}.`));
      reason.textContent = sweep.reason || "";
      drawTable();
      const key = JSON.stringify(trials.map((t) => [t.job_id, t.state, t.points, t.value]));
      if (key !== shown) {
        shown = key;
        drawCharts();
      }
    }

    scParam.addEventListener("change", () => data && drawCharts());
    compareBtn.addEventListener("click", () => {
      if (!data) return;
      const pick = picked || defaultPick(data.trials, data.sweep.spec.objective.mode);
      const ids = data.trials.map((t) => t.job_id).filter((j) => pick.has(j)).slice(0, COMPARE_MAX);
      if (ids.length) location.hash = `#/compare?jobs=${ids.join(",")}`;
    });
    cancelBtn.addEventListener("click", async () => {
      if (!window.confirm(`Cancel sweep ${id} and its queued and running trials?`)) return;
      cancelBtn.disabled = true;
      try {
        data.sweep = await api(`/sweeps/${id}/cancel`, {method: "POST"});
        badge.replaceChildren(ty.stateBadge(data.sweep.state));
        cancelBtn.hidden = data.sweep.state !== "running";
        poll.stop();
        poll = ty.poller(tick, ty.LIST_POLL_MS);  // the trials' ends come in live
      } catch (err) {
        ty.reportError(err);
      } finally {
        cancelBtn.disabled = false;
      }
    });

    const tick = async () => {
      let read = await api(`/sweeps/${id}/series?max_points=${maxPoints}`);
      // The points the page draws stay about the same however many trials there are: a few
      // trials get long lines, many get short ones (read again at once if that is more).
      const fit = Math.max(16, Math.min(2000, Math.floor(POINTS_BUDGET / Math.max(1, read.trials.length))));
      if (fit > maxPoints && read.trials.some((t) => t.points > t.x.length)) {
        read = await api(`/sweeps/${id}/series?max_points=${fit}`);
      }
      maxPoints = fit;
      data = read;
      ty.showNotice("");
      draw();
      const live = data.sweep.state === "running" || data.trials.some((t) => !ty.TERMINAL.has(t.state));
      return live;
    };
    let poll = ty.poller(tick, ty.LIST_POLL_MS);
    return {stop() { poll.stop(); }};
  }

  ty.routes.push({path: /^#\/sweeps\/(\d+)$/, page: sweepPage});
  ty.routes.push({path: /^#\/sweeps$/, page: sweepsPage});
})();
