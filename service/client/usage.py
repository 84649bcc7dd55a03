"""``torchyard usage``: who used what (``GET /usage``), as a table or CSV; and the teams'
standing in ``torchyard team list`` (``standing_rows``). docs/cli.md."""

import csv
import sys
from typing import Annotated, Literal

import typer
from rich.table import Table

from service.client.options import DEFAULT_URL, TokenOpt, UrlOpt, connect, console

CSV_FIELDS = ("team", "user", "job_id", "slot_seconds", "jobs", "attempts")


def usage(
    since: Annotated[str | None, typer.Option(
        help="from this date or time (UTC unless it says), e.g. 2026-12-01")] = None,
    until: Annotated[str | None, typer.Option(help="to this date or time; default now")] = None,
    by: Annotated[Literal["team", "user", "job"], typer.Option(
        "--by", help="one row per team, user or job")] = "team",
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV on stdout")] = False,
    url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
) -> None:
    """Slot-hours used (slots held × time held), your team's (an admin: everyone's)."""
    params = {"group_by": by, **({"since": since} if since else {}),
              **({"until": until} if until else {})}
    with connect(url, token) as client:
        report = client.request("GET", "/usage", params=params)
    rows = report["items"]
    if as_csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(CSV_FIELDS)
        for row in rows:
            writer.writerow(["" if row[f] is None else row[f] for f in CSV_FIELDS])
        return
    columns = {"team": ["team"], "user": ["team", "user"], "job": ["team", "user", "job_id"]}[by]
    table = Table(*columns, "slot-hours", "jobs", "attempts")
    for row in rows:
        table.add_row(*("-" if row[c] is None else str(row[c]) for c in columns),
                      f"{row['slot_seconds'] / 3600:.2f}", str(row["jobs"]), str(row["attempts"]))
    console.print(table)
    console.print(f"{report['since'] or 'from the start'} → {report['until']}", style="dim",
                  highlight=False)


def standing_rows(teams: list[dict]) -> Table:
    """``team list``: each team's limits and where it stands."""
    table = Table("name", "max_slots", "slot_hours", "share", "max_priority", "running",
                  "borrowed", "recent slot-h", "period slot-h", "rank", "waits")
    for team in teams:
        quota, used, fair = team.get("quota") or {}, team.get("usage") or {}, \
            team.get("fair_share") or {}
        table.add_row(
            team["name"], _cell(quota.get("max_slots")),
            _cell(quota.get("slot_hours")) + (f" /{quota['period']}" if quota else ""),
            _cell(team.get("share")), _cell(team.get("max_priority")),
            _cell(used.get("running_slots")), _cell(used.get("borrowed_slots")),
            _cell(used.get("recent_slot_hours"), ".2f"), _cell(used.get("period_slot_hours"), ".2f"),
            _cell(fair.get("rank")), "budget spent" if used.get("budget_spent") else "")
    return table


def _cell(value: object, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec and isinstance(value, int | float) else str(value)
