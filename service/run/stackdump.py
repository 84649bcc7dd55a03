"""Where every rank is: Python stacks of a running attempt's ranks, taken by the job's attempt loop.

The attempt loop (``service.run.attemptloop``) takes them without any change to the job's script, with
the sampler ``LaunchConfig.stack_sampler`` names (py-spy's ``dump``: every thread of a process,
read through ptrace; the attempt loop is the ranks' ancestor, so it has the rights where the kernel's Yama
``ptrace_scope`` is 0 or 1 — a container also needs ``CAP_SYS_PTRACE``):

* at a heartbeat timeout, before the group is stopped: :func:`hang_reason` keeps them in
  ``RUN_DIR/stacks/attempt-<n>.json`` and names the ranks that are not inside a collective,
  with their innermost frame of user code;
* on request: the server writes ``RUN_DIR/stacks/requests/<nonce>``; the attempt loop's poll
  (:func:`answer_requests`) answers with ``RUN_DIR/stacks/<nonce>.json`` (the requests waiting
  at one poll share one snapshot).

After the attempt, :func:`keep_with_attempt` adds the hang's per-rank summary to the attempt
record and moves the NCCL Flight Recorder's dumps (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, set by the
server) into ``RUN_DIR/stacks/attempt-<n>-flight-recorder/``. Nothing here raises: when stacks
cannot be taken the snapshot's ``error`` says why and the attempt goes on as it would have.

Where the ranks are is the launcher's to know (``service.run.launcher``, its ``dump_stacks``;
this module samples the processes it names). A rank program is the child of its
``service.run.ranktee`` (whose ``--run-dir`` names the run), with ``RANK`` in its environment.
Locally the ranks are found below the attempt loop; warm ranks
(``service.run.warm``) are processes of the warm server instead, which names them (its ``status``:
pid, job and rank of each): each warm rank has let the attempt loop trace it (``PR_SET_PTRACER``, see
``torchyard_contract.envnames.STACKS_TRACER``), as an ancestor may a cold one. On Slurm the
attempt loop runs ``python -m service.run.stackdump`` on every node as a step overlapping the attempt's
(``srun --overlap``); each finds its node's ranks among all its processes and dumps them.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Protocol

import psutil

from service.run.rankprocs import node_rank_processes
from torchyard_contract import runwrite
from torchyard_contract.launch import LaunchConfig
from torchyard_contract.rundir import RunDir
from torchyard_contract.runfiles import HangStacks, RankWhere, made, read_attempt, write_run_file
from torchyard_contract.safefile import read_bytes

DUMP_TIMEOUT_S = 10.0
FRAMES_MAX = 200  # per thread
THREADS_MAX = 64  # per rank
REQUESTS_MAX = 16  # answered per poll, all by one snapshot
SNAPSHOT_MAX_BYTES = 8 * 1024 * 1024  # a hang's snapshot read back (the server's bound too)
_COLLECTIVE_FILES = re.compile(
    r"torch/distributed/(?!elastic/)|torch/nn/parallel/distributed\.py"
)
_BACKWARD = re.compile(r"torch/autograd/|torch/_tensor\.py")
_NOT_USER = re.compile(
    r"/(site|dist)-packages/|/lib/python3\.\d+/|^<|service/run/ranktee\.py"
)
_C10D_WRAPPERS = {"wrapper", "_wrapper", "inner", "__call__"}


def stacks_dir(run: RunDir) -> Path:
    return run.stacks_dir


def hang_file(run: RunDir, number: int) -> Path:
    return stacks_dir(run) / f"attempt-{number}.json"


def _frame(f: dict) -> dict:
    return {"name": str(f.get("name"))[:200], "file": str(f.get("filename"))[:500],
            "line": f.get("line") if isinstance(f.get("line"), int) else None}


def _is_user(frame: dict) -> bool:
    return not _NOT_USER.search(frame["file"]) and "/torch/" not in frame["file"]


def classify(threads: list[dict]) -> dict:
    """A rank's state from its threads (frames innermost first): ``collective`` (inside
    ``torch.distributed`` or DDP, or in backward, where DDP's reducer all-reduces), else
    ``elsewhere``; ``collective`` names the call, ``where`` the innermost frame of user code."""
    main = next((t for t in threads if t["name"] == "MainThread"), threads[0] if threads else None)
    if main is None:
        return {"state": "unknown", "collective": None, "where": None}
    frames = main["frames"]
    at = next((i for i, f in enumerate(frames) if _is_user(f)), None)
    inner = frames if at is None else frames[:at]  # what the innermost user frame called
    collective = None
    for f in inner:
        name = f["name"].rsplit(".", 1)[-1]
        if _COLLECTIVE_FILES.search(f["file"]) and name not in _C10D_WRAPPERS:
            collective = name
            break
    if collective is None and any(_BACKWARD.search(f["file"]) for f in inner):
        if any("backward" in f["name"] for f in inner):
            collective = "backward (DDP's gradient all-reduce)"
    user = frames[at] if at is not None else None
    where = f"{Path(user['file']).name}:{user['line']} in {user['name']}" if user else None
    return {"state": "collective" if collective else "elsewhere",
            "collective": collective, "where": where}


class StackSource(Protocol):
    """Where the ranks' stacks come from: the attempt loop's launcher
    (``service.run.launcher``: below this process, or on every node of a Slurm allocation)."""

    def dump_stacks(self, run: RunDir, config: LaunchConfig) -> tuple[list[dict], str | None]:
        ...


def take(
    run: RunDir, config: LaunchConfig, number: int, trigger: str, source: StackSource,
) -> dict:
    """Every rank's stacks now (the ranks' dumps run in parallel), classified."""
    started = time.time()
    snapshot: dict = {"attempt": number, "trigger": trigger, "taken_at": started,
                      "host": socket.gethostname(), "error": None, "ranks": []}
    entries, error = source.dump_stacks(run, config)
    snapshot["ranks"] = sorted(entries, key=lambda e: e["rank"])
    snapshot["error"] = error
    snapshot["took_s"] = round(time.time() - started, 3)
    return snapshot


def find_sampler(sampler: str | None) -> tuple[str | None, str | None]:
    """(the sampler's path, None), or (None, why there is none)."""
    path = shutil.which(sampler) if sampler else None
    if path is not None:
        return path, None
    return None, (f"the stack sampler {sampler!r} was not found" if sampler
                  else "stacks are turned off (TORCHYARD_STACK_SAMPLER is off)")


def dump_processes(
    ranks: dict[int, psutil.Process], sampler: str, deadline: float,
) -> tuple[list[dict], str | None]:
    """py-spy on each of ``ranks`` at once; the entries, and the error when none was taken."""
    if not ranks:
        return [], "no rank process found (the ranks have not started yet)"
    dumps = {
        rank: subprocess.Popen(
            [sampler, "dump", "--pid", str(proc.pid), "--json"], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for rank, proc in sorted(ranks.items())
    }
    entries, errors = [], []
    for rank, popen in dumps.items():
        entry: dict = {"rank": rank, "pid": ranks[rank].pid, "threads": [], "error": None}
        try:
            out, err = popen.communicate(timeout=max(0.5, deadline - time.time()))
            if popen.returncode != 0:
                raise RuntimeError(_sampler_error(err.decode("utf-8", "replace")))
            entry["threads"] = [
                {"name": str(t.get("thread_name") or t.get("thread_id"))[:100],
                 "active": bool(t.get("active")),
                 "frames": [_frame(f) for f in (t.get("frames") or [])[:FRAMES_MAX]]}
                for t in json.loads(out)[:THREADS_MAX]
            ]
        except (subprocess.TimeoutExpired, RuntimeError, ValueError, TypeError) as exc:
            popen.kill()
            popen.wait()
            entry["error"] = str(exc)[:500] or type(exc).__name__
            errors.append(f"rank {rank}: {entry['error']}")
        entry.update(classify(entry["threads"]) if entry["error"] is None
                     else {"state": "unknown", "collective": None, "where": None})
        entries.append(entry)
    return entries, (errors[0] if errors and len(errors) == len(dumps) else None)


def node_entries(answers: list[str]) -> tuple[list[dict], list[str]]:
    """The rank entries of the nodes' answers (:func:`node_main`'s lines), one per rank, and
    the nodes' errors. Nodes that share a host (a test cluster's) each see every rank there,
    and their samplers attach to the same rank at once, where one of the two may be refused:
    a dump that worked is kept over one that did not."""
    entries, errors = [], []
    for line in (line for text in answers for line in text.splitlines()):
        try:
            node = json.loads(line)
        except ValueError:
            continue
        if isinstance(node, dict):
            entries += [e for e in node.get("ranks", []) if isinstance(e, dict)]
            if node.get("error"):
                errors.append(f"{node.get('host')}: {node['error']}")
    by_rank: dict[object, dict] = {}
    for entry in entries:
        kept = by_rank.get(entry.get("rank"))
        if kept is None or (kept.get("error") and not entry.get("error")):
            by_rank[entry.get("rank")] = entry
    return list(by_rank.values()), errors


def _sampler_error(stderr: str) -> str:
    text = " ".join(stderr.split())[:300]
    if "ermission" in text or "ptrace" in text.lower():
        return (f"no ptrace rights over the rank ({text}); a container needs CAP_SYS_PTRACE "
                "(docs/lifecycle.md)")
    return f"the sampler failed: {text}" if text else "the sampler failed"


def hang_reason(
    run: RunDir, config: LaunchConfig, number: int, reason: str, source: StackSource,
) -> str:
    """At a heartbeat timeout: take and keep the stacks; the reason, naming the stuck ranks."""
    snapshot = take(run, config, number, "heartbeat timeout", source)
    _write_snapshot(hang_file(run, number), snapshot)
    return describe_hang(snapshot, reason)


def describe_hang(snapshot: dict, reason: str) -> str:
    if snapshot.get("error"):
        return f"heartbeat timeout: {reason} (stacks not taken: {snapshot['error']})"
    stuck = [r for r in snapshot["ranks"] if r["state"] == "elsewhere"]
    waiting = [r for r in snapshot["ranks"] if r["state"] == "collective"]
    parts = [
        f"rank {r['rank']} not in a collective, at {r['where'] or 'no frame of user code'}"
        for r in stuck
    ]
    by_call: dict[str, list[str]] = {}
    for r in waiting:
        by_call.setdefault(r["collective"], []).append(str(r["rank"]))
    parts += [f"ranks {', '.join(ranks)} waiting in {call}" for call, ranks in by_call.items()]
    if not stuck and waiting:
        parts.insert(0, "every rank waiting in a collective")
    return f"heartbeat timeout: {'; '.join(parts)} ({reason})"


def answer_requests(
    run: RunDir, config: LaunchConfig, number: int, source: StackSource,
) -> None:
    """Answer the server's requests for stacks (``stacks/requests/<nonce>``): those waiting at
    this poll (up to ``REQUESTS_MAX``) all get one snapshot, so however many are asked at once
    the attempt loop's next look at its deadline and heartbeats waits for one ``take`` at most
    (``DUMP_TIMEOUT_S``)."""
    requests = stacks_dir(run) / "requests"
    try:
        names = [p.name for p in requests.iterdir() if re.fullmatch(r"[0-9a-f]{16,64}", p.name)]
    except OSError:
        return
    names = names[:REQUESTS_MAX]
    if not names:
        return
    for name in names:
        (requests / name).unlink(missing_ok=True)
    snapshot = take(run, config, number, "request", source)
    for name in names:
        _write_snapshot(stacks_dir(run) / f"{name}.json", snapshot)


def keep_with_attempt(run: RunDir, number: int) -> None:
    """After attempt ``number``: the hang's summary into its record; Flight Recorder dumps kept."""
    try:
        prefix = run.flight_recorder_prefix
        dumps = list(prefix.parent.glob(prefix.name + "*")) if prefix.parent.is_dir() else []
        if dumps:
            kept = stacks_dir(run) / f"attempt-{number}-flight-recorder"
            kept.mkdir(parents=True, exist_ok=True)
            for dump in dumps[:1024]:
                if dump.is_file() and not dump.is_symlink():
                    os.replace(dump, kept / dump.name)
        raw = read_bytes(hang_file(run, number), SNAPSHOT_MAX_BYTES)
        if raw is None:
            return  # no hang (or not a file this process wrote)
        snapshot = json.loads(raw)
        record = read_attempt(run, number)
        if record is None:
            raise ValueError(f"attempt {number}'s record cannot be read back")
        stacks = made(HangStacks, error=snapshot.get("error"), ranks=[
            made(RankWhere, **{k: r.get(k) for k in ("rank", "state", "collective", "where")})
            for r in snapshot.get("ranks", [])
        ])
        write_run_file(run.attempt_file(number), record.model_copy(update={"stacks": stacks}))
    except (OSError, ValueError, AttributeError) as exc:
        print(f"attempt {number}: stacks not kept: {exc}", flush=True)


def _write_snapshot(path: Path, snapshot: dict) -> None:
    """A snapshot for the server (``service.domain.files.stackrequest`` reads it), written as
    every run file is: atomically, never through a link the job planted."""
    runwrite.make_dir(path.parent)
    runwrite.write_file(path, json.dumps(snapshot).encode())


def node_main(argv: list[str]) -> None:
    """``python -m service.run.stackdump RUN_DIR WORLD_SIZE SAMPLER``: one node's ranks of that run
    (a task of the attempt loop's ``srun --overlap`` step), as one JSON line on stdout."""
    run, world_size, sampler = RunDir(Path(argv[0])), int(argv[1]), argv[2]
    path, error = find_sampler(sampler)
    entries: list[dict] = []
    if path is not None:
        entries, error = dump_processes(node_rank_processes(run, world_size), path,
                                        time.time() + DUMP_TIMEOUT_S)
    print(json.dumps({"host": socket.gethostname(), "ranks": entries, "error": error}), flush=True)


if __name__ == "__main__":
    import sys

    node_main(sys.argv[1:])
