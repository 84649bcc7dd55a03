// Teams and their fair share (docs/dashboard.md, docs/scheduling.md "Teams"): #/teams
// Each team (an admin sees every team; anyone else their own): slots held against max_slots
// (borrowed ones counted), slot-hours of the period against the budget and when it resets,
// recent usage, share, fair-share factor and rank, and why its jobs wait when the budget is
// spent; below, this period's usage by user (GET /usage). Refreshed every 2 s.
"use strict";

(() => {
  const ty = window.torchyard;
  const {h, api} = ty;

  // A bar of used against a limit (none: the value alone); past the limit it is full and red.
  function meter(used, limit, unit, id) {
    const text = limit === null || limit === undefined ? `${used} ${unit}`
      : `${used} of ${limit} ${unit}`;
    if (!limit) return h("span", {id}, text + (limit === 0 ? "" : ", no limit"));
    const share = Math.min(1, used / limit);
    return h("div", {class: "meter", id},
      h("div", {class: `meter-bar${used >= limit ? " over" : ""}`,
                style: `width: ${(share * 100).toFixed(1)}%`, role: "presentation"}),
      h("span", {class: "meter-text"}, text));
  }

  function hours(x) {
    return x >= 10 ? x.toFixed(1) : x.toPrecision(3).replace(/\.?0+$/, "");
  }

  function teamRow(t) {
    const q = t.quota || {};
    const u = t.usage || {};
    const fair = t.fair_share || {};
    const held = `${u.running_slots ?? 0}` + (u.borrowed_slots ? ` (${u.borrowed_slots} borrowed)` : "");
    const period = u.period === "rolling_30d" ? "last 30 days"
      : `this month, resets ${u.resets_at ? u.resets_at.slice(0, 10) : ""}`;
    return h("tr", {"data-team": t.name},
      h("th", {scope: "row"}, t.name),
      h("td", {}, q.max_slots === undefined || q.max_slots === null
        ? h("span", {id: `slots-${t.name}`}, `${held}, no limit`)
        : meter(u.running_slots ?? 0, q.max_slots, "slots", `slots-${t.name}`),
        u.borrowed_slots ? h("div", {class: "quiet"}, `${u.borrowed_slots} borrowed`) : ""),
      h("td", {}, q.slot_hours === undefined || q.slot_hours === null
        ? h("span", {id: `budget-${t.name}`}, `${hours(u.period_slot_hours ?? 0)} slot-h, no budget`)
        : meter(Number(hours(u.period_slot_hours ?? 0)), q.slot_hours, "slot-h", `budget-${t.name}`),
        h("div", {class: "quiet"}, period)),
      h("td", {}, hours(u.recent_slot_hours ?? 0)),
      h("td", {}, t.share),
      h("td", {}, fair.factor === undefined ? "" : hours(fair.factor)),
      h("td", {class: "rank", id: `rank-${t.name}`}, fair.rank ?? ""),
      h("td", {}, t.max_priority),
      h("td", {class: "waiting-reason", id: `spent-${t.name}`}, u.budget_spent || ""));
  }

  function teamsPage() {
    const view = document.getElementById("view");
    const teams = h("div", {id: "teams"});
    const usage = h("div", {id: "usage"});
    view.replaceChildren(h("h1", {}, "Teams"),
      h("p", {class: "quiet"}, "The next job to start comes from the team with the lowest " +
        "fair-share factor (recent usage, halved every half-life, divided by its share) among " +
        "the jobs that fit; a team past its budget starts nothing until it resets or is raised."),
      teams, h("section", {}, h("h2", {}, "Usage this month, by user"), usage));

    const monthStart = () => {
      const now = new Date();
      return new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1)).toISOString();
    };
    return ty.poller(async () => {
      const [list, report] = await Promise.all([
        api("/teams"), api(`/usage?group_by=user&since=${encodeURIComponent(monthStart())}`)]);
      ty.showNotice("");
      const rows = list.slice().sort((a, b) =>
        (a.fair_share?.rank ?? Infinity) - (b.fair_share?.rank ?? Infinity) || a.name.localeCompare(b.name));
      const table = h("table", {class: "grid", id: "team-table"},
        h("thead", {}, h("tr", {}, ["team", "slots held / max_slots", "slot-hours / budget",
          "recent slot-h", "share", "factor", "rank", "max priority", "why its jobs wait"].map(
          (c) => h("th", {scope: "col"}, c)))),
        h("tbody", {}, rows.map(teamRow)));
      ty.keepFocus(teams, () => teams.replaceChildren(rows.length ? ty.scroller(table)
        : h("p", {class: "quiet", id: "no-teams"}, "No team yet (POST /teams, torchyard team add).")));
      const used = h("table", {class: "grid", id: "usage-table"},
        h("thead", {}, h("tr", {}, ["team", "user", "slot-hours", "jobs", "runs"].map(
          (c) => h("th", {scope: "col"}, c)))),
        h("tbody", {}, report.items.map((r) => h("tr", {"data-user": r.user || ""},
          h("td", {}, r.team ?? "(no team)"), h("td", {}, r.user ?? ""),
          h("td", {}, hours(r.slot_seconds / 3600)), h("td", {}, r.jobs), h("td", {}, r.attempts)))));
      ty.keepFocus(usage, () => usage.replaceChildren(report.items.length ? ty.scroller(used)
        : h("p", {class: "quiet", id: "usage-empty"}, "Nothing used this month.")));
    }, ty.LIST_POLL_MS);
  }

  ty.routes.push({path: /^#\/teams$/, page: teamsPage});
})();
