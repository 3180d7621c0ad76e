"""Job failures: which job events are failures, and what an alert about one says. Pure.

A `job.finished` with a non-zero exit code is a failure unless the node stopped
the job for a planned stop (`interrupted`): exited with a code, killed by a
signal (a negative code, or 128 + the signal as a shell reports it), or out of
memory (the reason or the last log lines say so). `job.failed` (the command
could not start, or died abnormally) always is. The fields feed the rule's
summary and labels: `outcome`, `exit_code`, `signal`, `cause`, the job's
`team` and `project` (from its `job.submitted`), `log_tail` (the last
LOG_TAIL_LINES log lines when the event carries them) and `description`
(those lines under a heading, at most DESCRIPTION_MAX characters: what the
receivers show below the summary).
"""

from __future__ import annotations

import signal as signals
from typing import Any

LOG_TAIL_LINES = 10
DESCRIPTION_MAX = 2000
OOM_HINTS = ("out of memory", "outofmemory", "oom-kill", "oom kill", "cuda_error_out_of_memory")


def _signal_of(code: int | None) -> int | None:
    if code is None:
        return None
    if code < 0:
        return -code
    if 128 < code < 128 + 65:
        return code - 128
    return None


def _signal_name(num: int) -> str:
    try:
        return signals.Signals(num).name
    except ValueError:
        return f"signal {num}"


def failure_fields(event: str, fields: dict[str, Any], owner: tuple[str, str] | None) -> dict[str, Any] | None:
    """The fields of a failure alert for a job event, or None when the event is no failure."""
    if event not in ("job.finished", "job.failed"):
        return fields
    code = fields.get("exit_code")
    if event == "job.finished" and (code in (0, None) or fields.get("interrupted")):
        return None
    tail_raw = fields.get("log_tail") or []
    tail = [str(line) for line in (tail_raw.splitlines() if isinstance(tail_raw, str) else tail_raw)]
    tail = tail[-LOG_TAIL_LINES:]
    reason = str(fields.get("reason") or "")
    text = (reason + "\n" + "\n".join(tail)).lower()
    sig = _signal_of(code if isinstance(code, int) else None)
    if any(h in text for h in OOM_HINTS):
        cause, outcome = "oom", f"ran out of memory (exit code {code})" if code is not None else "ran out of memory"
    elif sig is not None:
        cause, outcome = "signal", f"was killed by {_signal_name(sig)} (exit code {code})"
    elif code is not None:
        cause, outcome = "exit", f"exited with code {code}"
    else:
        cause, outcome = "start", f"could not run: {reason}"
    team, project = owner or ("", "")
    return {**fields, "cause": cause, "outcome": outcome, "signal": _signal_name(sig) if sig else "",
            "exit_code": "" if code is None else str(code), "team": team or "unknown", "project": project or "",
            "log_tail": "\n".join(tail), "reason": reason or outcome, "description": _description(tail)}


def _description(tail: list[str]) -> str:
    """The last log lines under a heading, cut from the top to DESCRIPTION_MAX characters ("" without lines)."""
    if not tail:
        return ""
    text = "\n".join(tail)
    if len(text) > DESCRIPTION_MAX - 40:
        text = "…" + text[-(DESCRIPTION_MAX - 41):]
    return f"last {len(tail)} log line(s):\n{text}"
