"""The last lines of a failed attempt's log, for its job.finished (`log_tail`). Pure: bytes in, lines out.

What a terminal would show of the end of the log: each line as its last
carriage return left it (a progress bar in its final state), escape sequences
and other control characters dropped, blank lines skipped; at most
`LOG_TAIL_LINES` lines of at most `LOG_LINE_MAX` characters (a longer line
keeps its end, where the error usually is). The agent reads only the last
`TAIL_BYTES` of the file.

Secrets are not passed on (shared/redaction.py): the values of the job's
secret-named variables and whatever follows `password=`, `token: ` or
`Bearer ` become `[redacted]`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from whaleflux.shared.job_events import LOG_LINE_MAX, LOG_TAIL_LINES
from whaleflux.shared.redaction import redact, secret_values

TAIL_BYTES = 16 * 1024
_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b.")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _shown(line: str) -> str:
    if "\r" in line or "\x1b" in line:
        # The last state a carriage return left (a progress bar redrawn in place); escapes dropped.
        line = next((seg for seg in reversed(_ESCAPE.sub("", line).split("\r")) if seg.strip()), "")
    return _CONTROL.sub("", line).replace("\t", "    ").rstrip()


def tail_lines(data: bytes, env: Mapping[str, str] | None = None, truncated: bool = False) -> list[str]:
    """The last lines of `data` (the end of a log; `truncated`: it starts mid-file, so its first line is cut)."""
    lines = data.decode(errors="replace").split("\n")
    if truncated:
        lines = lines[1:]
    shown = [t for t in (_shown(line) for line in lines) if t.strip()][-LOG_TAIL_LINES:]
    secrets = secret_values(env or {})
    out = []
    for text in shown:
        text = redact(text, secrets)
        out.append(text if len(text) <= LOG_LINE_MAX else "…" + text[-(LOG_LINE_MAX - 1):])
    return out
