"""The last lines of a failed attempt's log, for its job.finished (`log_tail`). Pure: bytes in, lines out.

What a terminal would show of the end of the log: each line as its last
carriage return left it (a progress bar in its final state), escape sequences
and other control characters dropped, blank lines skipped; at most
`LOG_TAIL_LINES` lines of at most `LOG_LINE_MAX` characters (a longer line
keeps its end, where the error usually is). The agent reads only the last
`TAIL_BYTES` of the file.

Secrets are not passed on: the value of every variable of the job's
environment whose name says it is a secret (`TOKEN`, `SECRET`, `PASSWORD`,
`KEY`, `CREDENTIAL`, `AUTH`, ...), and whatever follows `password=`,
`token: ` or `Bearer `, becomes `[redacted]`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from whaleflux.shared.job_events import LOG_LINE_MAX, LOG_TAIL_LINES

TAIL_BYTES = 16 * 1024
REDACTED = "[redacted]"
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|KEY|CREDENTIAL|AUTH|PRIVATE|COOKIE|SESSION",
                          re.IGNORECASE)
_SECRET_TEXT = re.compile(
    r"(?i)(\bbearer\s+|\b(?:password|passwd|token|secret|api[_-]?key|access[_-]?key)\b\s*[=:]\s*)[^\s\"',;]+")
_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b.")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
MIN_SECRET_LEN = 4  # shorter values ("1", "yes") would mask ordinary text


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of the job's environment that are secrets by their variable's name, longest first."""
    found = {v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= MIN_SECRET_LEN}
    return sorted(found, key=len, reverse=True)


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
        for value in secrets:
            text = text.replace(value, REDACTED)
        text = _SECRET_TEXT.sub(lambda m: m.group(1) + REDACTED, text)
        out.append(text if len(text) <= LOG_LINE_MAX else "…" + text[-(LOG_LINE_MAX - 1):])
    return out
