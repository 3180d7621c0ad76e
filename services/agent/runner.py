"""Run a job's command as a real child process on the node."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from whaleflux.shared.events import JobPlaced

# The agent's own connection secrets must never leak into a job's environment.
_PRIVATE_ENV = ("WHALEFLUX_", "NATS_", "REDIS_")


def checkpoint_dir(placed: JobPlaced, home: Path) -> Path:
    """Where the job keeps checkpoints: its own choice, else one folder per job that every attempt shares."""
    return Path(placed.checkpoint_dir) if placed.checkpoint_dir else home / "checkpoints" / placed.job_id


def job_environment(placed: JobPlaced, base: dict[str, str] | None = None, home: Path | None = None) -> dict[str, str]:
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items() if not k.startswith(_PRIVATE_ENV)}
    env.update(placed.env)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(placed.gpu_uuids),
            "WHALEFLUX_JOB_ID": placed.job_id,
            "WHALEFLUX_ATTEMPT": str(placed.attempt),
            # A requeued attempt (preemption, failover) continues from here when WHALEFLUX_RESUME=1.
            "WHALEFLUX_RESUME": "1" if placed.resume else "0",
        }
    )
    if home is not None or placed.checkpoint_dir:
        env["WHALEFLUX_CHECKPOINT_DIR"] = str(checkpoint_dir(placed, home or Path(".")))
    return env


@dataclass
class RunningJob:
    placed: JobPlaced
    process: asyncio.subprocess.Process
    log_path: Path


async def launch(placed: JobPlaced, log_dir: Path) -> RunningJob:
    """Start the command; raise OSError if it cannot start."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{placed.job_id}.{placed.attempt}.log"
    # Logs live in <home>/jobs, default checkpoints in <home>/checkpoints.
    env = job_environment(placed, home=log_dir.parent)
    Path(env["WHALEFLUX_CHECKPOINT_DIR"]).mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = await asyncio.create_subprocess_exec(
            *placed.command,
            env=env,
            cwd=placed.workdir or None,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group, so stop() reaches its children
        )
    return RunningJob(placed, proc, log_path)


async def stop(job: RunningJob, grace_s: float = 10.0) -> None:
    """SIGTERM the job's process group, then SIGKILL after the grace period."""
    if job.process.returncode is not None:
        return
    try:
        os.killpg(job.process.pid, signal.SIGTERM)
        await asyncio.wait_for(job.process.wait(), grace_s)
    except ProcessLookupError:
        return
    except asyncio.TimeoutError:
        try:
            os.killpg(job.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await job.process.wait()
