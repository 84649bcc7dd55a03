"""Resolving a script job's ``entrypoint`` inside the script directories into a rank program.

Contract:

* :func:`rank_program` ``(spec, script_dirs, spec_file) -> RankProgram`` (and
  :func:`script_program` for script jobs only): what torchrun runs
  once per rank, as an argv list (never a shell string). Built-in jobs get
  ``-m worker --spec SPEC_FILE``. A script path (``train.py``, ``sub/train.py`` or an absolute
  path) is looked up in each script directory in order and becomes the resolved absolute file
  followed by ``spec.args``; ``-m package.module`` is looked up the same way (``package/module.py``
  or ``package/module/__main__.py``) and runs with ``PYTHONPATH`` set to the directory that holds
  it and ``PYTHONSAFEPATH=1`` (the working directory is not on ``sys.path``), so the module comes
  from the script directory, not from site-packages.
* Every candidate goes through :func:`torchyard_contract.confinement.confine` (the trusted
  roots' rule): ``..`` and symlinks that lead outside the script directories are refused even
  when the target exists.
* Raises :class:`ScriptsDisabled` when no script directory is configured, :class:`ScriptRefused`
  (a ``ValueError`` naming the field) for an entrypoint that is outside them or missing.
* A package job (``spec.package``) resolves its entrypoint the same way inside its own copy of
  the package (:func:`package_program`), which becomes the ranks' working directory and the
  first entry of ``PYTHONPATH`` (``LaunchConfig.workdir``); no script directory is needed.
* Reads only file metadata; never imports or runs the script. Called at submit (to refuse early)
  and again at launch (what runs is what exists then).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torchyard_contract.confinement import PathRefused, confine
from torchyard_contract.spec import JobSpec

FIELD = "entrypoint"
ENABLE_HINT = (
    "script jobs are disabled on this server; to enable them, start it with "
    "TORCHYARD_SCRIPT_DIRS set to the directories scripts may run from "
    "(e.g. TORCHYARD_SCRIPT_DIRS=/srv/torchyard/scripts)"
)


class ScriptRefused(ValueError):
    """An entrypoint that cannot run here; ``field`` names the spec field."""

    def __init__(self, message: str, field: str = FIELD) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class ScriptsDisabled(ScriptRefused):
    """``TORCHYARD_SCRIPT_DIRS`` is unset: no script job may run."""

    def __init__(self) -> None:
        super().__init__(ENABLE_HINT)


@dataclass(frozen=True)
class RankProgram:
    """What follows torchrun's own options, and where ``-m`` modules are imported from."""

    argv: tuple[str, ...]
    pythonpath: str | None = None
    workdir: str | None = None  # package jobs: the job's copy of its package


def package_program(spec: JobSpec, root: Path) -> RankProgram:
    """The rank program of a package job whose copy of the package is ``root``: the
    entrypoint resolved (and confined) inside it; the ranks start there, with it first on
    ``PYTHONPATH``. Raises ``ScriptRefused``."""
    try:
        program = script_program(spec, [root])
    except ScriptRefused as exc:
        raise ScriptRefused(
            str(exc).removeprefix(f"{FIELD}: ").replace("the script directories", "the package")
        ) from None
    return RankProgram(program.argv, workdir=str(root))


def builtin_program(spec_file: Path) -> RankProgram:
    return RankProgram(("-m", "worker", "--spec", str(spec_file)))


def rank_program(
    spec: JobSpec, script_dirs: Sequence[Path], spec_file: Path, package_root: Path | None = None,
) -> RankProgram:
    """The rank program for ``spec`` (see the module docstring); ``package_root``: the job's
    copy of its package, for a spec that names one."""
    if spec.entrypoint is None:
        return builtin_program(spec_file)
    if spec.package is not None:
        if package_root is None:
            raise ScriptRefused("a package job needs its copy of the package", "package")
        return package_program(spec, package_root)
    return script_program(spec, script_dirs)


def script_program(spec: JobSpec, script_dirs: Sequence[Path]) -> RankProgram:
    """The rank program of a script job; raises ``ScriptRefused``/``ScriptsDisabled``."""
    if spec.entrypoint is None:
        raise ScriptRefused("a script job needs an entrypoint")
    if not script_dirs:
        raise ScriptsDisabled()
    module = spec.entrypoint_module
    if module is not None:
        root = _find_module(module, script_dirs)
        return RankProgram(("-m", module, *spec.args), pythonpath=str(root))
    return RankProgram((str(_find_script(spec.entrypoint, script_dirs)), *spec.args))


def _confined_file(candidate: Path, script_dirs: Sequence[Path]) -> Path | None:
    """The resolved file if ``candidate`` is one inside the dirs; None if missing."""
    try:
        resolved = confine(str(candidate), script_dirs, FIELD)
        return resolved if resolved.is_file() else None
    except PathRefused as exc:
        raise ScriptRefused(str(exc).removeprefix(f"{FIELD}: ")) from None
    except (OSError, RuntimeError) as exc:  # a name too long, no permission, a symlink loop
        raise ScriptRefused(f"{str(candidate)[:200]!r} cannot be resolved ({exc})") from None


def _find_script(entrypoint: str, script_dirs: Sequence[Path]) -> Path:
    path = Path(entrypoint)
    candidates = [path] if path.is_absolute() else [Path(d) / path for d in script_dirs]
    for candidate in candidates:
        found = _confined_file(candidate, script_dirs)
        if found is not None:
            return found
    raise ScriptRefused(f"{entrypoint!r} is not a file in the script directories ({_dirs(script_dirs)})")


def _find_module(module: str, script_dirs: Sequence[Path]) -> Path:
    """The script directory holding ``module`` (first match wins)."""
    parts = module.split(".")
    for root in script_dirs:
        for candidate in (
            Path(root, *parts[:-1], parts[-1] + ".py"),
            Path(root, *parts, "__main__.py"),
        ):
            if _confined_file(candidate, script_dirs) is not None:
                return Path(root).resolve()
    raise ScriptRefused(
        f"module {module!r} is not in the script directories ({_dirs(script_dirs)}); expected "
        f"{'/'.join(parts)}.py or {'/'.join(parts)}/__main__.py in one of them"
    )


def _dirs(script_dirs: Sequence[Path]) -> str:
    return ", ".join(str(d) for d in script_dirs)
