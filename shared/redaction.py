"""Secrets masked in text a job wrote (its log) before anyone but its own node sees it. Pure: text in, text out.

The value of every variable of the job's environment whose name says it is a secret (`TOKEN`, `SECRET`,
`PASSWORD`, `KEY`, `CREDENTIAL`, `AUTH`, ...), and whatever follows `password=`, `token: ` or `Bearer `,
becomes `[redacted]`. The agent applies it to the log lines of a failed attempt's job.finished, the scheduler
(which keeps the job's environment) to the log text the console shows (`POST /v1/jobs/{id}/redact`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

REDACTED = "[redacted]"
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|KEY|CREDENTIAL|AUTH|PRIVATE|COOKIE|SESSION",
                          re.IGNORECASE)
_SECRET_TEXT = re.compile(
    r"(?i)(\bbearer\s+|\b(?:password|passwd|token|secret|api[_-]?key|access[_-]?key)\b\s*[=:]\s*)[^\s\"',;]+")
MIN_SECRET_LEN = 4  # shorter values ("1", "yes") would mask ordinary text


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of the job's environment that are secrets by their variable's name, longest first."""
    found = {v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= MIN_SECRET_LEN}
    return sorted(found, key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    """`text` with each of `secrets` (from `secret_values`) and each secret-looking assignment masked."""
    for value in secrets:
        text = text.replace(value, REDACTED)
    return _SECRET_TEXT.sub(lambda m: m.group(1) + REDACTED, text)
