// Runs side by side (docs/dashboard.md):
//   #/compare?jobs=1,2,…[&metrics=loss,accuracy][&ranks=1]
// Up to 10 jobs: one chart per chosen metric with each job's cross-rank mean (and its ranks'
// own lines on request), each job's final values, and the fields in which their specs differ.
// Jobs are picked with the checkboxes of the job list (kept in sessionStorage while paging) or
// sent from a sweep's page.
"use strict";

(() => {
  const ty = window.torchyard;
  const {h, api} = ty;
  const MAX_JOBS = 10;
  const SELECTED_KEY = "torchyard.compare";
  const POINTS = 1000;

  // ---- the job list's checkboxes ------------------------------------------------------------

  function selected() {
    try {
      const ids = JSON.parse(sessionStorage.getItem(SELECTED_KEY) || "[]");
      return Array.isArray(ids) ? ids.filter(Number.isInteger).slice(0, MAX_JOBS) : [];
    } catch {
      return [];
    }
  }

  function listSelect() {
    const button = h("button", {type: "button", id: "compare-button"}, "Compare");
    const clear = h("button", {type: "button", id: "compare-clear", class: "quiet"}, "Clear");
    const note = h("span", {class: "quiet", id: "compare-note", "aria-live": "polite"});
    const bar = h("div", {class: "compare-bar"}, button, clear, note);
    const boxes = new Map();
    function refresh() {
      const ids = selected();
      button.disabled = ids.length < 1;
      button.textContent = ids.length ? `Compare ${ids.length} job(s)` : "Compare";
      note.textContent = ids.length ? `jobs ${ids.join(", ")}`
        : `tick up to ${MAX_JOBS} jobs to compare them`;
    }
    button.addEventListener("click", () => {
      const ids = selected();
      if (ids.length) location.hash = `#/compare?jobs=${ids.join(",")}`;
    });
    clear.addEventListener("click", () => {
      sessionStorage.removeItem(SELECTED_KEY);
      for (const box of boxes.values()) box.checked = false;
      refresh();
    });
    refresh();
    return {
      bar,
      box(job) {
        const box = h("input", {type: "checkbox", checked: selected().includes(job.id),
                                "aria-label": `select job ${job.id}`, "data-focus": `sel-${job.id}`,
                                class: "select-job"});
        box.addEventListener("change", () => {
          let ids = selected().filter((i) => i !== job.id);
          if (box.checked) {
            if (ids.length >= MAX_JOBS) {
              box.checked = false;
              note.textContent = `at most ${MAX_JOBS} jobs`;
              return;
            }
            ids = [...ids, job.id];
          }
          sessionStorage.setItem(SELECTED_KEY, JSON.stringify(ids));
          refresh();
        });
        boxes.set(job.id, box);
        return box;
      },
    };
  }

  // ---- the page -----------------------------------------------------------------------------

  // {"a": {"b": 1}, "c": [1]} → {"a.b": "1", "c": "[1]"}: what a spec says, field by field.
  function flatten(obj, prefix = "", out = {}) {
    for (const [k, v] of Object.entries(obj || {})) {
      const key = prefix ? `${prefix}.${k}` : k;
      if (v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length) {
        flatten(v, key, out);
      } else {
        out[key] = JSON.stringify(v);
      }
    }
    return out;
  }

  function differing(jobs) {
    const flat = jobs.map((j) => flatten(j.spec));
    const keys = [...new Set(flat.flatMap((f) => Object.keys(f)))].sort();
    return keys.filter((k) => new Set(flat.map((f) => f[k])).size > 1)
      .map((k) => ({field: k, values: flat.map((f) => f[k])}));
  }

  function lastValue(line) {
    return line && line.y.length ? {x: line.x[line.x.length - 1], y: line.y[line.y.length - 1]} : null;
  }

  function comparePage(_match, query) {
    ty.loadPlotly().catch(() => {});  // while the jobs are read
    const view = document.getElementById("view");
    const asked = (query.get("jobs") || "").split(",").map(Number).filter((n) => Number.isInteger(n) && n > 0);
    const ids = [...new Set(asked)].slice(0, MAX_JOBS);
    let metrics = (query.get("metrics") || "loss").split(",").filter(Boolean);
    let ranks = query.get("ranks") === "1";
    const title = h("h1", {}, `Compare ${ids.length} job(s)`);
    const note = h("p", {class: "quiet", id: "compare-notes"});
    const metricBox = h("fieldset", {class: "metrics", id: "compare-metrics"},
                        h("legend", {}, "Metrics"));
    const ranksBox = h("input", {type: "checkbox", id: "compare-ranks", checked: ranks});
    const charts = h("div", {id: "compare-charts"});
    const finals = h("div", {id: "compare-finals"});
    const diffs = h("div", {id: "compare-diff"});
    view.replaceChildren(title, note,
      h("div", {class: "row wrap"}, metricBox,
        h("label", {}, ranksBox, " per-rank lines")),
      h("section", {}, h("h2", {}, "Jobs and final values"), finals),
      charts,
      h("section", {}, h("h2", {}, "Spec fields that differ"), diffs));
    if (!ids.length) {
      note.textContent = "No jobs chosen: tick jobs in the job list, or compare a sweep's trials.";
      return {stop() {}};
    }
    note.textContent = asked.length > ids.length ? `Showing the first ${MAX_JOBS} jobs.` : "";

    let jobs = [];  // as read, in the order asked
    const series = {};  // `${jobId}:${metric}` → the series page
    let available = [];

    function writeUrl() {
      const q = new URLSearchParams({jobs: ids.join(",")});
      if (metrics.join() !== "loss") q.set("metrics", metrics.join(","));
      if (ranks) q.set("ranks", "1");
      history.replaceState(null, "", `#/compare?${q}`);
    }

    async function load(job, metric) {
      const read = (level) => api(`/jobs/${job.id}/series?` + new URLSearchParams(
        {name: metric, level, max_points: String(POINTS)}));
      let s = await read("epoch");
      if (!s.lines.length) {  // a job that reports only per step is compared by step
        const steps = await read("step");
        if (steps.lines.length) s = steps;
      }
      series[`${job.id}:${metric}`] = s;
    }

    function drawMetricChoices() {
      const names = [...new Set([...available, ...metrics])].sort();
      if (Array.from(metricBox.querySelectorAll("input"), (i) => i.value).join() === names.join()) {
        for (const i of metricBox.querySelectorAll("input")) i.checked = metrics.includes(i.value);
        return;
      }
      metricBox.replaceChildren(h("legend", {}, "Metrics"), ...names.map((n) => h("label", {},
        h("input", {type: "checkbox", value: n, checked: metrics.includes(n), class: "metric-pick",
          onchange: async (ev) => {
            metrics = ev.target.checked ? [...metrics, n] : metrics.filter((m) => m !== n);
            writeUrl();
            await refresh(false).catch(ty.reportError);
          }}), ` ${n}`)));
    }

    function color(i) { return ty.PALETTE[i % ty.PALETTE.length]; }

    function drawCharts() {
      const els = metrics.map((m, k) => {
        let el = charts.querySelector(`[data-metric="${CSS.escape(m)}"]`);
        if (!el) el = h("div", {class: "chart compare-chart", id: `compare-chart-${k}`, "data-metric": m});
        return el;
      });
      charts.replaceChildren(...metrics.map((m, k) => h("section", {},
        h("h2", {}, m), els[k])));
      metrics.forEach((m, k) => {
        const traces = [];
        let level = "epoch";
        jobs.forEach((job, i) => {
          const s = series[`${job.id}:${m}`];
          if (!s) return;
          level = s.level;
          if (s.mean.x.length) {
            traces.push({type: "scatter", mode: s.mean.x.length > 60 ? "lines" : "lines+markers",
              name: `job ${job.id} · ${job.name}`, meta: {kind: "mean", job_id: job.id},
              x: s.mean.x, y: s.mean.y.map(ty.toNumber), line: {color: color(i), width: 2.5}});
          }
          if (ranks) {
            for (const line of s.lines) {
              traces.push({type: "scatter", mode: "lines",
                name: `job ${job.id} rank ${line.rank}` + (line.attempt > 1 ? ` attempt ${line.attempt}` : ""),
                meta: {kind: "rank", job_id: job.id, rank: line.rank},
                x: line.x, y: line.y.map(ty.toNumber), showlegend: false,
                line: {color: color(i), width: 1, dash: ty.DASHES[(line.rank + 1) % ty.DASHES.length]}});
            }
          }
        });
        const lastX = Math.max(0, ...traces.map((t) => t.x[t.x.length - 1] || 0));
        ty.plot(els[k], traces, {uirevision: `compare-${m}`,
                                 xaxis: {title: {text: level}, dtick: lastX <= 12 ? 1 : undefined},
                                 yaxis: {title: {text: m}}});
      });
    }

    function drawTables() {
      const rows = jobs.map((job, i) => h("tr", {"data-job-id": job.id},
        h("td", {}, h("span", {class: "swatch", style: `background:${color(i)}`})),
        h("td", {}, h("a", {href: `#/jobs/${job.id}`}, `job ${job.id}`)),
        h("td", {}, job.name),
        h("td", {}, ty.stateBadge(job.state)),
        metrics.map((m) => {
          const last = lastValue((series[`${job.id}:${m}`] || {}).mean);
          return h("td", {class: "final", "data-metric": m},
            last ? [ty.fmtValue(last.y), h("span", {class: "quiet"}, ` @${last.x}`)] : "");
        })));
      finals.replaceChildren(ty.scroller(h("table", {class: "grid", id: "compare-table"},
        h("thead", {}, h("tr", {}, h("th", {}, h("span", {class: "sr-only"}, "colour")),
          ["job", "name", "state"].map((c) => h("th", {}, c)),
          metrics.map((m) => h("th", {}, `final ${m}`)))),
        h("tbody", {}, rows))));
      const diff = differing(jobs);
      diffs.replaceChildren(diff.length ? ty.scroller(h("table", {class: "grid", id: "diff-table"},
        h("thead", {}, h("tr", {}, h("th", {}, "field"), jobs.map((j) => h("th", {}, `job ${j.id}`)))),
        h("tbody", {}, diff.map((d) => h("tr", {"data-field": d.field}, h("th", {}, d.field),
          d.values.map((v) => h("td", {}, v === undefined ? "—" : v)))))))
        : h("p", {class: "quiet"}, "The specs are the same."));
    }

    // all: the jobs too (their states); otherwise only the series not read yet.
    async function refresh(all) {
      if (all) {
        const read = await Promise.all(ids.map((i) => api(`/jobs/${i}`).catch((err) => {
          if (err instanceof ty.ApiFailure && err.status === 404) return null;
          throw err;
        })));
        const missing = ids.filter((_, k) => read[k] === null);
        jobs = read.filter(Boolean);
        if (missing.length) note.textContent = `No job ${missing.join(", ")}.`;
      }
      const wanted = [];
      for (const job of jobs) {
        for (const m of metrics) {
          if (all ? !ty.TERMINAL.has(job.state) || !series[`${job.id}:${m}`]
                  : !series[`${job.id}:${m}`]) wanted.push(load(job, m));
        }
      }
      await Promise.all(wanted);
      available = [...new Set(Object.values(series).flatMap((s) => s.names))];
      drawMetricChoices();
      drawTables();
      drawCharts();
      return jobs.some((j) => !ty.TERMINAL.has(j.state));
    }

    ranksBox.addEventListener("change", () => {
      ranks = ranksBox.checked;
      writeUrl();
      drawCharts();
    });
    title.textContent = `Compare ${ids.length} job(s): ${ids.join(", ")}`;
    const poll = ty.poller(() => refresh(true), ty.LIST_POLL_MS);
    return {stop() { poll.stop(); }};
  }

  ty.listSelect = listSelect;
  ty.routes.push({path: /^#\/compare$/, page: comparePage});
})();
