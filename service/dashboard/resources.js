// The box (docs/dashboard.md): #/resources
// Every GPU and CPU slot with the job holding it (name, owner and team where the API has them,
// since when), on Slurm the partition's nodes, the warm-rank pool, and the queue in the order it
// starts with each waiting job's reason. Refreshed every 2 s.
"use strict";

(() => {
  const ty = window.torchyard;
  const {h, api} = ty;
  const HOLDING = ["starting", "running", "pausing"];  // states in which a job holds its slots
  const LIST_MAX = 500;

  function kv(rows) {
    return h("table", {class: "grid kv"}, h("tbody", {}, rows.map(([k, v]) =>
      h("tr", {}, h("th", {}, k), h("td", {}, v)))));
  }

  function warmTable(warm) {
    if (!warm) return h("p", {class: "quiet", id: "warm-off"}, "Warm ranks are off on this server.");
    return kv([
      ["state", h("span", {class: `state warm-${warm.state}`, id: "warm-state"}, warm.state)],
      ["idle / pool size", `${warm.idle} / ${warm.pool_size}`],
      ["running a rank", warm.active],
      ["hand-offs served / refused", `${warm.served} / ${warm.refused}`],
      ["memory", ty.fmtBytes(warm.memory_bytes) +
        (warm.memory_limit_bytes ? ` of ${ty.fmtBytes(warm.memory_limit_bytes)}` : "")],
      ["restarts", warm.restarts],
    ]);
  }

  function jobLink(job, id, prefix) {
    return h("a", {href: `#/jobs/${id}`, "data-focus": `${prefix}-${id}`},
      job ? `${id} · ${job.name}` : `job ${id}`);
  }

  function needs(spec) {
    const ranks = (spec.nproc_per_node || 1) * (spec.nnodes || 1);
    return `${ranks} rank${ranks === 1 ? "" : "s"}, ${spec.device || "auto"}`;
  }

  function resourcesPage() {
    const view = document.getElementById("view");
    const totals = h("p", {id: "resource-totals"});
    const slots = h("div", {id: "slots"});
    const nodes = h("div", {id: "nodes"});
    const warm = h("div", {id: "warm"});
    const queue = h("div", {id: "queue"});
    view.replaceChildren(h("h1", {}, "Resources"), totals,
      h("section", {}, h("h2", {}, "Slots"), slots, nodes),
      h("section", {}, h("h2", {}, "Queue, in start order"), queue),
      h("section", {}, h("h2", {}, "Warm ranks"), warm));

    return ty.poller(async () => {
      const [res, queued, ...holding] = await Promise.all([
        api("/resources"),
        api(`/jobs?state=queued&limit=${LIST_MAX}`),
        ...HOLDING.map((s) => api(`/jobs?state=${s}&limit=${LIST_MAX}`)),
      ]);
      const jobs = new Map(holding.flatMap((l) => l.items).map((j) => [j.id, j]));
      const missing = [...new Set(res.items.map((r) => r.job_id).filter((id) => id !== null && !jobs.has(id)))];
      for (const j of await Promise.all(missing.map((id) => api(`/jobs/${id}`)))) jobs.set(j.id, j);
      ty.showNotice("");

      const kinds = [["gpu", "GPUs"], ["cpu", "CPU slots"]].filter(([k]) => res[k].total > 0);
      totals.textContent = kinds.map(([k, label]) =>
        `${label}: ${res[k].allocated} of ${res[k].total} in use, ${res[k].free} free`).join(" · ") +
        (res.executor !== "local" ? ` (executor: ${res.executor})` : "");

      const holders = res.items.map((r) => (r.job_id === null ? null : jobs.get(r.job_id)));
      const who = ty.people(holders);
      const slotTable = h("table", {class: "grid", id: "slot-table"},
        h("thead", {}, h("tr", {}, ["resource", "job", "state", ...who, "since"].map(
          (c) => h("th", {}, c)))),
        h("tbody", {}, res.items.map((r, k) => {
          const job = holders[k];
          return h("tr", {"data-resource": r.name, class: r.job_id === null ? "free" : "held"},
            h("td", {}, r.name),
            h("td", {}, r.job_id === null ? h("span", {class: "quiet"}, "free")
              : jobLink(job, r.job_id, `slot-${r.name}`)),
            h("td", {}, job ? ty.stateBadge(job.state) : ""),
            who.map((c) => h("td", {}, job ? ty.personCell(job[c]) : "")),
            job ? ty.timeCell(job.started_at) : h("td", {}));
        })));
      ty.keepFocus(slots, () => slots.replaceChildren(res.items.length ? ty.scroller(slotTable)
        : h("p", {class: "quiet"}, "This executor books no slots of its own (see the nodes).")));

      nodes.replaceChildren(res.nodes && res.nodes.length ? ty.scroller(h("table", {class: "grid", id: "node-table"},
        h("thead", {}, h("tr", {}, ["node", "state", "partition", "CPUs in use", "GPUs"].map(
          (c) => h("th", {}, c)))),
        h("tbody", {}, res.nodes.map((n) => h("tr", {},
          h("td", {}, n.name), h("td", {}, n.state), h("td", {}, n.partition),
          h("td", {}, `${n.cpus_allocated} / ${n.cpus}`), h("td", {}, n.gpus)))))) : "");

      warm.replaceChildren(warmTable(res.warm));

      // The scheduler's order: queue_position (priority, then first come); a job it has not
      // placed yet (submitted since its last pass) goes last, by id.
      const waiting = queued.items.slice().sort((a, b) =>
        (a.queue_position ?? Infinity) - (b.queue_position ?? Infinity) || a.id - b.id);
      const qwho = ty.people(waiting);
      const queueTable = h("table", {class: "grid", id: "queue-table"},
        h("thead", {}, h("tr", {}, ["#", "job", "priority", "needs", "why it waits", ...qwho,
                                    "waiting"].map((c) => h("th", {}, c)))),
        h("tbody", {}, waiting.map((j) => h("tr", {"data-job-id": j.id},
          h("td", {}, j.queue_position ?? ""),
          h("td", {}, jobLink(j, j.id, "queued")),
          h("td", {}, j.spec.priority ?? 0),
          h("td", {}, needs(j.spec)),
          h("td", {class: "waiting-reason"}, j.waiting_reason || "not placed yet"),
          qwho.map((c) => h("td", {}, ty.personCell(j[c]))),
          ty.timeCell(j.created_at)))));
      ty.keepFocus(queue, () => queue.replaceChildren(waiting.length ? ty.scroller(queueTable)
        : h("p", {class: "quiet", id: "queue-empty"}, "Nothing waits.")));
    }, ty.LIST_POLL_MS);
  }

  ty.routes.push({path: /^#\/resources$/, page: resourcesPage});
})();
