"""How a file name a job chose is written in the artifact listing, and read back from a URL.

A Linux file name is bytes, and a job may pick bytes that are not UTF-8, which JSON cannot
carry. A listed name is the name decoded as UTF-8 with every byte that is not part of valid
UTF-8 written ``%XX`` (two upper-case hex digits), and ``%`` itself written ``%25``: any name has
one listed form, and two names never share one. A name that is UTF-8 without ``%`` is listed as
it is. A client downloads by the listed path, URL-quoted like any path (``%`` → ``%25``).
"""

import os
import re

from torchyard_contract.confinement import name_refusal

_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")


def listed_name(name: str | bytes) -> str:
    """The listed form of a file name as ``os.scandir`` gives it (str with surrogate escapes,
    or bytes)."""
    if isinstance(name, str) and name.isascii() and "%" not in name:
        return name  # the common case: nothing to escape
    text = os.fsencode(name).decode("utf-8", "surrogateescape")
    return "".join(
        "%25" if ch == "%"
        else f"%{ord(ch) - 0xDC00:02X}" if "\udc80" <= ch <= "\udcff"
        else ch
        for ch in text
    )


def name_bytes(listed: str) -> bytes | None:
    """The file name a listed name stands for, or None where it names no possible file (empty,
    ``.``, ``..``, a ``/`` or a NUL byte, also written ``%2F`` or ``%00``: the untrusted trees'
    rule of ``torchyard_contract.confinement``). A ``%`` not followed by two hex digits is taken
    as itself."""
    try:
        raw = _ESCAPE.sub(lambda m: bytes([int(m[1], 16)]), listed.encode("utf-8"))
    except UnicodeEncodeError:
        return None
    return None if name_refusal(raw) is not None else raw
