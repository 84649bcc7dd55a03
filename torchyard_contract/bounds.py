"""Bounds on the text a job can make the server store or send: reasons and log tails.

A job runs arbitrary code, so an exception message, a log line or a file it leaves in its run
directory can be any size (an 8 MiB ``RuntimeError`` became a 16.8 MB ``GET /jobs`` page). What
is stored and answered is cut here, saying so; the full text stays in the job's logs
(``GET /jobs/<id>/logs?rank=<r>``, ``RUN_DIR/logs/``), which are read in pages.
"""

REASON_MAX_CHARS = 2000  # a job's or an attempt's reason, as stored and answered
LOG_LINE_MAX_CHARS = 300  # one line of a log tail quoted in a reason
WHERE_FULL_TEXT = "the full text is in the job's logs"


def bounded_text(text: str, limit: int = REASON_MAX_CHARS) -> str:
    """``text`` if at most ``limit`` characters, else its start and a note of what was cut."""
    if len(text) <= limit:
        return text
    note = f" … [{len(text) - limit} more characters; {WHERE_FULL_TEXT}]"
    return text[: max(0, limit - len(note))] + note


def bounded_line(line: str) -> str:
    """One quoted log line: at most ``LOG_LINE_MAX_CHARS``, ending with ``…`` when cut."""
    return line if len(line) <= LOG_LINE_MAX_CHARS else line[: LOG_LINE_MAX_CHARS - 1] + "…"
