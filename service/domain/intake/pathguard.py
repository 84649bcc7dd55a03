"""Confining user-named filesystem paths (scripts, dataset roots, ...) to configured roots.

Contract: :func:`confine` resolves ``path`` (relative paths against the first root) with every
symlink followed, and returns the resolved path only if it lies inside one of ``roots`` (each
resolved the same way). ``..`` segments and symlinks that lead outside are refused. It raises
:class:`PathRefused` (a ``ValueError``) whose message names ``field`` and the allowed roots;
it never creates, opens or reads the target.
"""

from collections.abc import Sequence
from pathlib import Path


class PathRefused(ValueError):
    """A user-named path outside the configured roots (or no roots are configured)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def confine(path: str, roots: Sequence[Path], field: str) -> Path:
    """The resolved ``path`` if it is inside one of ``roots``; else :class:`PathRefused`."""
    if not roots:
        raise PathRefused(field, "no directories are configured for this")
    if "\x00" in path:
        raise PathRefused(field, "must not contain NUL bytes")
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
