"""``python -m bench [all | NAME ...] [--smoke] [--json PATH] [--update-docs]``.

Runs the named benchmarks (``all``: every one, in the order below) in this one process, one
after another, and prints a Markdown table per benchmark under a description of the machine.
``--update-docs`` writes that text into docs/benchmarks.md between the results markers.
"""

import argparse
import importlib
import json
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from bench.common import Row, fmt, machine

BENCHES = ("startup", "endpath", "orchestration", "trainer", "ingest", "polling", "scheduling",
           "fairshare", "slurm", "stores", "stacks", "pause", "idle", "procstart", "dashboard",
           "tracking")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
START, END = "<!-- bench:results:start -->", "<!-- bench:results:end -->"


def render(results: dict[str, list[Row]], before: dict, after: dict, smoke: bool) -> str:
    """Markdown: the machine, then one table per benchmark."""
    smoke_note = " (smoke sizes: not figures)" if smoke else ""
    header = (
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC{smoke_note} on {before['nproc']} cores "
        f"({before['cpu']}), {before['memory_gib']} GiB; Python {before['python']}, "
        f"torch {before['torch']}, FastAPI {before['fastapi']}, uvicorn {before['uvicorn']}, "
        f"SQLAlchemy {before['sqlalchemy']}, SQLite {before['sqlite']}."
    )
    lines = [
        header,
        f"Load average (1, 5, 15 min) before: {before['loadavg']}; after: {after['loadavg']}.",
        "",
    ]
    for name, rows in results.items():
        lines += [f"#### {name}", "", "| metric | value | unit | goal | note |", "|---|---|---|---|---|"]
        lines += [f"| {r.metric} | {fmt(r.value)} | {r.unit} | {r.goal} | {r.note} |" for r in rows]
        lines.append("")
    return "\n".join(lines)


def update_docs(text: str, path: Path = DOCS) -> None:
    doc = path.read_text(encoding="utf-8")
    head, _, rest = doc.partition(START)
    _, _, tail = rest.partition(END)
    path.write_text(f"{head}{START}\n{text}\n{END}{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> dict[str, list[Row]]:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("names", nargs="*", default=["all"], help=f"all, or some of {BENCHES}")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the scripts run")
    parser.add_argument("--json", type=Path, help="also write the rows and the machine here")
    parser.add_argument("--update-docs", action="store_true", help=f"write the tables into {DOCS}")
    args = parser.parse_args(argv)
    names = list(BENCHES) if "all" in args.names else args.names
    unknown = sorted(set(names) - set(BENCHES))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {BENCHES}")
    before = machine()
    results: dict[str, list[Row]] = {}
    failed = []
    for name in names:
        started = time.monotonic()
        try:
            results[name] = importlib.import_module(f"bench.{name}").run(args.smoke)
        except Exception as exc:  # one broken benchmark must not lose the others' figures
            if len(names) == 1:
                raise
            failed.append(name)
            results[name] = [Row(name, "FAILED", f"{type(exc).__name__}: {exc}"[:200], "")]
            traceback.print_exc()
        took = time.monotonic() - started
        print(f"[bench] {name}: {took:.0f} s", file=sys.stderr)
        print(render({name: results[name]}, before, machine(), args.smoke), file=sys.stderr)
    after = machine()
    text = render(results, before, after, args.smoke)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({
            "machine_before": before, "machine_after": after, "smoke": args.smoke,
            "rows": [r.as_dict() for rows in results.values() for r in rows],
        }, indent=1))
    if args.update_docs:
        update_docs(text)
    if failed:
        sys.exit(f"benchmarks failed: {failed}")
    return results


if __name__ == "__main__":
    main()
