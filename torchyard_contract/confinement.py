"""The one policy for a path someone else names, inside a root the server chose.

Two kinds of root, one rule each; every caller uses one of them and adds only its own bounds:

* **Trusted roots** — directories the operator set up: script and data directories
  (``TORCHYARD_SCRIPT_DIRS``, ``TORCHYARD_DATA_DIRS``), a job's run directory looked at by its
  executor. A path means what it resolves to (every symlink followed, ``..`` folded; a relative
  one against the first root) and must resolve inside a root: :func:`confine` (a user's path:
  :class:`PathRefused` naming the field and the roots) and :func:`resolves_inside` (a file the
  server found: yes or no). Only metadata is read; nothing is opened.
* **Untrusted trees** — what a job or an upload made: an archive's members
  (``service.domain.files.treewriter``), a job's outputs and checkpoints
  (``service.domain.files.artifacts``). A path there is a sequence of plain names
  (:func:`relative_parts`, one name: :func:`name_refusal`): relative, never ``..``, never NUL,
  never empty. It is then created or opened one component at a time with ``O_NOFOLLOW`` from a
  descriptor of the root, so no link in the tree is followed (that walk is each caller's: it
  holds the descriptors).

Pure (no settings, no I/O beyond ``resolve``'s metadata): both sides may import it.
"""

from collections.abc import Sequence
from pathlib import Path, PurePosixPath

NUL_RULE = "must not contain NUL bytes"
ABSOLUTE_RULE = "absolute paths are not allowed"
PARENT_RULE = "'..' is not allowed in a name"
EMPTY_RULE = "an empty name"


class PathRefused(ValueError):
    """A path outside its roots, or one that is no plain relative path; ``field`` names what
    the caller asked for (a spec field), ``rule`` what was broken."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.rule = message


def resolves_inside(path: Path | str, roots: Sequence[Path]) -> Path | None:
    """``path`` resolved (symlinks followed, ``..`` folded) if that lies inside one of
    ``roots`` (each resolved the same way), else None; a path that cannot be resolved (a loop,
    no permission) is None too."""
    try:
        resolved = Path(path).resolve()
        return next((resolved for root in roots
                     if resolved == (r := Path(root).resolve()) or resolved.is_relative_to(r)),
                    None)
    except (OSError, RuntimeError):
        return None


def confine(path: str, roots: Sequence[Path], field: str) -> Path:
    """The resolved ``path`` if it is inside one of the trusted ``roots`` (a relative path is
    taken against the first); else :class:`PathRefused` naming ``field`` and the roots. Raises
    ``OSError``/``RuntimeError`` where resolving itself fails (the caller says why)."""
    if not roots:
        raise PathRefused(field, "no directories are configured for this")
    if "\x00" in path:
        raise PathRefused(field, NUL_RULE)
    resolved_roots = [Path(r).resolve() for r in roots]
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = resolved_roots[0] / candidate
    resolved = candidate.resolve()  # follows symlinks, folds '..'
    for root in resolved_roots:
        if resolved == root or resolved.is_relative_to(root):
            return resolved
    allowed = ", ".join(str(r) for r in resolved_roots)
    raise PathRefused(field, f"{path!r} is outside the allowed directories ({allowed})")


def name_refusal(name: str | bytes) -> str | None:
    """Why ``name`` cannot be one component of a path in an untrusted tree (empty, ``.``,
    ``..``, a ``/`` or a NUL in it); None when it can."""
    raw = name.encode("utf-8", "surrogateescape") if isinstance(name, str) else name
    if b"\x00" in raw:
        return NUL_RULE
    if raw in (b"", b"."):
        return EMPTY_RULE
    if raw == b"..":
        return PARENT_RULE
    if b"/" in raw:
        return "a name must not contain '/'"
    return None


def relative_parts(path: str, field: str = "") -> tuple[str, ...]:
    """``path`` as the plain names of a relative path in an untrusted tree (``.`` components
    and repeated slashes dropped); :class:`PathRefused` (its ``rule``: NUL, absolute, ``..``,
    nothing left) otherwise."""
    if "\x00" in path:
        raise PathRefused(field, NUL_RULE)
    pure = PurePosixPath(path)
    if path.startswith("/") or pure.is_absolute():
        raise PathRefused(field, ABSOLUTE_RULE)
    if ".." in pure.parts:
        raise PathRefused(field, PARENT_RULE)
    parts = tuple(p for p in pure.parts if p != ".")
    if not parts:
        raise PathRefused(field, EMPTY_RULE)
    return parts
