// Panels of the job page beyond its charts and logs (app.js places them; docs/dashboard.md):
//   - a sweep's trial: a link back to its sweep and the parameters it was given;
//   - outputs: the files the job kept (GET /jobs/{id}/artifacts, by cursor) with download links,
//     the package it ran (digest, size) and its MLflow run where the server tracks one;
//   - the submitted spec, read-only, with "Submit a copy" (#/submit?copy=<id>).
"use strict";

(() => {
  const ty = window.torchyard;
  const {h, api} = ty;
  const OUTPUTS_PAGE = 100;
  const OUTPUTS_REFRESH_MS = 5000;  // while the job runs; once more when it ends

  function paramsText(params) {
    return Object.entries(params || {}).map(([k, v]) => `${k} = ${ty.fmtValue(v)}`).join(", ");
  }

  function sweepPanel() {
    const top = h("p", {id: "job-sweep", class: "trial-of", hidden: true});
    let shown = false;
    return {
      top,
      update(job) {
        if (shown || job.sweep_id === null || job.sweep_id === undefined) return;
        shown = true;
        top.hidden = false;
        top.replaceChildren("Trial of ",
          h("a", {href: `#/sweeps/${job.sweep_id}`, id: "job-sweep-link"}, `sweep ${job.sweep_id}`),
          job.params ? h("span", {}, " · ", h("span", {id: "job-params"}, paramsText(job.params)))
            : "");
      },
      stop() {},
    };
  }

  function artifactHref(jobId, path) {
    return `/jobs/${jobId}/artifacts/${path.split("/").map(encodeURIComponent).join("/")}`;
  }

  function outputsPanel(jobId) {
    const body = h("tbody", {id: "output-rows"});
    const table = h("table", {class: "grid", id: "outputs-table", hidden: true},
      h("thead", {}, h("tr", {}, ["path", "size", "modified"].map((c) => h("th", {}, c)))), body);
    const note = h("p", {class: "quiet", id: "outputs-note"}, "Loading outputs.");
    const more = h("button", {type: "button", id: "outputs-more", hidden: true}, "Load more");
    const pkg = h("p", {id: "job-package", hidden: true});
    const mlflow = h("p", {id: "job-mlflow", hidden: true});
    const section = h("section", {id: "outputs"}, h("h2", {}, "Outputs"), note,
                      ty.scroller(table), more, pkg, mlflow);
    let items = [];
    let next = null;
    let loadedAt = 0;
    let lastState = null;
    let pkgShown = null;

    function row(a) {
      const when = new Date(a.modified * 1000);
      return h("tr", {"data-path": a.path},
        h("td", {}, ty.downloadLink(artifactHref(jobId, a.path), a.path,
                                    {"data-focus": `out-${a.path}`})),
        h("td", {title: `${a.size} bytes`}, ty.fmtBytes(a.size)),
        h("td", {title: when.toISOString()}, when.toLocaleString()));
    }

    function draw() {
      table.hidden = !items.length;
      note.hidden = items.length > 0;
      note.textContent = "No output files (yet): a job keeps what it writes to " +
        "TORCHYARD_OUTPUT_DIR, and its checkpoints.";
      ty.keepFocus(body, () => body.replaceChildren(...items.map(row)));
      more.hidden = next === null;
    }

    // The first pages again, as many files as are shown (files may have been added).
    async function reload() {
      const want = Math.max(items.length, OUTPUTS_PAGE);
      const got = [];
      let after = null;
      do {
        const q = new URLSearchParams({limit: String(Math.min(1000, want - got.length))});
        if (after !== null) q.set("after", after);
        const page = await api(`/jobs/${jobId}/artifacts?${q}`);
        got.push(...page.items);
        after = page.next_after;
      } while (after !== null && got.length < want);
      items = got;
      next = after;
      draw();
    }

    more.addEventListener("click", async () => {
      more.disabled = true;
      try {
        const q = new URLSearchParams({limit: String(OUTPUTS_PAGE), after: next});
        const page = await api(`/jobs/${jobId}/artifacts?${q}`);
        items = items.concat(page.items);
        next = page.next_after;
        draw();
      } catch (err) {
        ty.reportError(err);
      } finally {
        more.disabled = false;
      }
    });

    async function showPackage(digest) {
      if (pkgShown === digest) return;
      pkgShown = digest;
      pkg.hidden = false;
      pkg.replaceChildren("Package ", h("code", {}, digest));
      const p = await api(`/packages/${encodeURIComponent(digest)}`);
      pkg.replaceChildren("Package ", h("code", {title: p.digest}, p.digest),
        ` · ${ty.fmtBytes(p.size)} · ${p.files} files`);
    }

    function showMlflow(job) {
      const run = job.mlflow;  // with the tracking issue; absent before it
      if (!run || !run.run_id) return;
      mlflow.hidden = false;
      mlflow.replaceChildren("MLflow run ", run.url
        ? h("a", {href: run.url, rel: "noopener noreferrer", target: "_blank"}, run.run_id)
        : h("code", {}, run.run_id));
    }

    return {
      section,
      async update(job) {
        showMlflow(job);
        if (job.spec.package) showPackage(job.spec.package).catch(ty.reportError);
        const changed = job.state !== lastState;
        const due = !ty.TERMINAL.has(job.state) && Date.now() - loadedAt > OUTPUTS_REFRESH_MS;
        if (!changed && !due) return;
        lastState = job.state;
        loadedAt = Date.now();
        await reload().catch(ty.reportError);
      },
      stop() {},
    };
  }

  // What "Submit a copy" pre-fills: the job's spec as stored (every default filled in), less the
  // sweep label a trial gets (a copy is not a trial). secret_env holds names only: a secret's
  // value lives in the server's secrets file and never in a spec.
  async function copiedSpec(jobId) {
    const job = await api(`/jobs/${jobId}`);
    const spec = JSON.parse(JSON.stringify(job.spec));
    if (job.sweep_id !== null && job.sweep_id !== undefined && spec.labels) {
      delete spec.labels.sweep;
    }
    return spec;
  }

  function specPanel(jobId) {
    const pre = h("pre", {class: "spec", id: "job-spec", tabindex: "0",
                          "aria-label": "the submitted spec (read-only JSON)"});
    const secrets = h("p", {class: "quiet", id: "job-secrets", hidden: true});
    const copy = h("button", {type: "button", id: "copy-button", hidden: !ty.canControl()},
                   "Submit a copy");
    copy.addEventListener("click", () => { location.hash = `#/submit?copy=${jobId}`; });
    const section = h("section", {id: "spec-section"},
      h("div", {class: "row"}, h("h2", {}, "Spec"), copy), secrets, pre);
    let shown = false;
    return {
      section,
      update(job) {
        if (shown) return;
        shown = true;
        pre.textContent = JSON.stringify(job.spec, null, 2);
        const names = Object.keys(job.spec.secret_env || {});
        secrets.hidden = !names.length;
        secrets.textContent = names.length
          ? `Secrets (names only; the values stay on the server): ${names.join(", ")}` : "";
      },
      stop() {},
    };
  }

  // One panel for the outputs and the spec, side by side on a wide screen.
  function extrasPanel(jobId) {
    const parts = [sweepPanel(jobId), outputsPanel(jobId), specPanel(jobId)];
    return {
      top: parts[0].top,
      section: h("div", {class: "columns extras"}, parts[1].section, parts[2].section),
      update(job) { for (const p of parts) p.update(job); },
      stop() { for (const p of parts) p.stop(); },
    };
  }

  ty.jobPanels.push(extrasPanel);
  ty.copiedSpec = copiedSpec;
})();
