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
    env.update(gang_environment(placed, env))
    return env


def gang_environment(placed: JobPlaced, job_env: dict[str, str]) -> dict[str, str]:
    """Where this process sits in its job: node rank, node count, the coordinator (rank 0) node.

    Set for every job (a one-node job is rank 0 of 1 on its own node). The
    torchrun names NODE_RANK, NNODES and MASTER_ADDR are set too for a gang
    spanning nodes, unless the job's own environment sets them: MASTER_ADDR is
    the rank-0 node's name, which is its host name for an `--nvml` agent (set
    WHALEFLUX_NODE_NAME or the job's MASTER_ADDR where that does not resolve).
    """
    nodes = placed.gang_nodes or [placed.node]
    out = {
        "WHALEFLUX_NODE_RANK": str(placed.part),
        "WHALEFLUX_NUM_NODES": str(len(nodes)),
        "WHALEFLUX_COORDINATOR": nodes[0],
        "WHALEFLUX_GANG_NODES": ",".join(nodes),
        "WHALEFLUX_GANG_GPUS": str(placed.gang_gpus or len(placed.gpu_uuids)),
    }
    if placed.gang_nodes:
        for name, value in (("NODE_RANK", str(placed.part)), ("NNODES", str(len(nodes))), ("MASTER_ADDR", nodes[0])):
            if name not in placed.env:
                out[name] = value
    return out


def log_name(job_id: str, attempt: int, rank: int = 0) -> str:
    """The log file of one attempt on this node: rank 0 (and a one-node job) `<job>.<attempt>.log`,
    another rank of a gang `<job>.<attempt>.rank<r>.log`."""
    return f"{job_id}.{attempt}.log" if not rank else f"{job_id}.{attempt}.rank{rank}.log"


@dataclass
class RunningJob:
    placed: JobPlaced
    process: asyncio.subprocess.Process
    log_path: Path


async def launch(placed: JobPlaced, log_dir: Path) -> RunningJob:
    """Start the command; raise OSError if it cannot start."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / log_name(placed.job_id, placed.attempt, placed.part)
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
