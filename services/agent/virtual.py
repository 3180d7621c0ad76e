"""Virtual jobs: a bench and test mode in which a placed job starts no process (`WHALEFLUX_VIRTUAL_JOBS=1`).

A virtual attempt "runs" for the duration its command states and then exits
0, so one agent process can carry a fleet of 1,000 nodes x 8 GPUs and the
control plane is measured alone. It reports job.started / job.finished like a
real attempt, is listed in heartbeats, and obeys stop orders (its end is then
recorded as interrupted with SIGTERM's exit code). It has no supervisor, no
attempt folder and no log: it does not outlive the agent (a restarted agent
knows nothing of it, and the scheduler ends it as lost) and does not fence
itself when the agent goes silent.

The duration: `sleep N` (also `sh -c "sleep N"`), else the job's env
`WHALEFLUX_VIRTUAL_S`; `true` ends at once with 0, `false` with 1; any other
command ends at once with 0. The job's env `WHALEFLUX_VIRTUAL_EXIT` sets the
exit code and `WHALEFLUX_VIRTUAL_LOG` the text it "printed" (its log, which
a failed attempt's job.finished ends with, as a real one's).
"""

from __future__ import annotations

import asyncio
import re
import signal
from dataclasses import dataclass, field

from whaleflux.shared.clock import Clock
from whaleflux.shared.events import JobPlaced

from . import attempts, logtail

DURATION_ENV = "WHALEFLUX_VIRTUAL_S"
EXIT_ENV = "WHALEFLUX_VIRTUAL_EXIT"
LOG_ENV = "WHALEFLUX_VIRTUAL_LOG"
_SLEEP = re.compile(r"^\s*sleep\s+(\d+(?:\.\d*)?|\.\d+)\s*$")


def stated_run(command: list[str], env: dict[str, str]) -> tuple[float, int]:
    """How long the command says it runs, and the exit code it ends with."""
    seconds, code = _stated(command, env)
    try:
        return seconds, int(env[EXIT_ENV]) if env.get(EXIT_ENV) else code
    except ValueError:
        return seconds, code


def _stated(command: list[str], env: dict[str, str]) -> tuple[float, int]:
    if env.get(DURATION_ENV):
        return max(float(env[DURATION_ENV]), 0.0), 0
    text = command[-1] if len(command) == 3 and command[:2] in (["sh", "-c"], ["bash", "-c"]) else " ".join(command)
    match = _SLEEP.match(text)
    if match:
        return float(match.group(1)), 0
    return 0.0, 1 if command[:1] == ["false"] else 0


def log_tail(placed: JobPlaced) -> list[str] | None:
    """The last lines of what a virtual attempt "printed" (its job's WHALEFLUX_VIRTUAL_LOG), secrets masked."""
    return logtail.tail_lines(placed.env.get(LOG_ENV, "").encode(), placed.env) or None


@dataclass
class VirtualJob:
    """An attempt that runs in the agent's memory only; the same face as `runner.RunningJob`."""

    placed: JobPlaced
    running: attempts.Running
    ended: asyncio.Task[attempts.Exit | None]
    stop_reason: asyncio.Future[str | None] = field(repr=False)
    dir: None = None  # no attempt folder


def launch(placed: JobPlaced, clock: Clock) -> VirtualJob:
    """Start a virtual attempt now; its `ended` completes after the stated duration, or at a stop."""
    seconds, exit_code = stated_run(placed.command, placed.env)
    running = attempts.Running(supervisor_pid=0, job_pid=0, started_at=clock())
    stop: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
    ended = asyncio.create_task(_run(seconds, exit_code, stop, clock), name=f"virtual-{placed.job_id}-{placed.attempt}")
    return VirtualJob(placed, running, ended, stop)


async def _run(seconds: float, exit_code: int, stop: asyncio.Future[str | None], clock: Clock) -> attempts.Exit:
    try:
        reason = await asyncio.wait_for(asyncio.shield(stop), seconds)
    except TimeoutError:
        return attempts.Exit(finished_at=clock(), exit_code=exit_code)
    return attempts.Exit(finished_at=clock(), exit_code=-signal.SIGTERM, interrupted=reason)


async def stop(job: VirtualJob, reason: str | None = None) -> None:
    """Stop it at once (as a job that honours SIGTERM); return once its end is recorded.

    `reason`: a planned stop, recorded as the attempt's `interrupted` (as `runner.stop`)."""
    if not job.stop_reason.done():
        job.stop_reason.set_result(reason)
    await job.ended
