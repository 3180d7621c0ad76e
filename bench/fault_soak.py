"""Fault soak: `python bench/fault_soak.py [--jobs 500] [--faults restarts,freeze,stall,disk,duplicates]`.

The demo fleet (four nodes, 28 GPUs) with the scheduler, billing and the
agent as real processes on servers of its own, `--jobs` short jobs that write
their own start and end marks, each submitted with an `Idempotency-Key`, and
while they run each fault in turn:
- restarts: the scheduler (kill -9), billing (kill -9), the agent (kill -9),
  Redis (FLUSHALL), nats-server (restart);
- freeze: the agent SIGSTOPped for 45 s (longer than the scheduler's 30 s
  "placed but never started" window), then SIGCONT;
- stall: nats-server SIGSTOPped for 20 s, while jobs are POSTed again with
  their keys (a client retrying through the stall), then every job;
- disk: the agent's attempt store, a 64 MB tmpfs, filled for 15 s (root only);
- duplicates: every job POSTed once more with its key after the faults.
Prints submitted / succeeded / ran twice / overlapping / stuck / jobs stored
per key, and billed against ran GPU-seconds. Target: 0 ran twice, 0
overlapping, 0 stuck, one job per key, billed within 1% of what ran.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.lifecycle import AUTH, OwnServers, billed_gpu_seconds, marked_command, own_servers, runs, start_stack  # noqa: E402
from tests.processes import Proc  # noqa: E402

NODES = ("r4090-01", "a100-01", "h100-01", "h200-01")
KINDS = ("restarts", "freeze", "stall", "disk", "duplicates")
DISK_MB = 64  # above the agent's WHALEFLUX_MIN_FREE_MIB (16): the store is healthy until it is filled


def post(url: str, body: dict, key: str) -> str | None:
    """POST one job with its key; its job id, or None when the answer was not 202 (a stall's 503, a timeout)."""
    try:
        r = httpx.post(url + "/v1/jobs", json=body, headers={**AUTH, "Idempotency-Key": key}, timeout=30)
    except httpx.HTTPError:
        return None
    return r.json()["job_id"] if r.status_code == 202 else None


def keyed_bodies(marks: Path, seconds: float, n: int) -> dict[str, dict]:
    """n marked jobs, each under a key of its own: key -> body."""
    bodies = {f"soak-{uuid.uuid4().hex}": {"name": f"marked-{i}", "team": "faults",
                                           "command": marked_command(marks, seconds)} for i in range(n)}
    return bodies


def post_all(url: str, bodies: dict[str, dict], answered: dict[str, set[str]]) -> None:
    """Each body POSTed with its key, once; the job ids answered, per key."""
    for key, body in bodies.items():
        if (job_id := post(url, body, key)) is not None:
            answered.setdefault(key, set()).add(job_id)


def billed_seconds(url: str, job_id: str) -> float:
    """The GPU-seconds billing charged the job (0 for one it holds no charge of: never ran)."""
    try:
        return float(billed_gpu_seconds(url, job_id))
    except (TypeError, KeyError, httpx.HTTPError):  # billing's 404 body, not a list of charges
        return 0.0


def freeze(proc: Proc, seconds: float) -> None:
    os.kill(proc.process.pid, signal.SIGSTOP)
    time.sleep(seconds)
    os.kill(proc.process.pid, signal.SIGCONT)


def stall_nats(own: OwnServers, url: str, bodies: dict[str, dict], answered: dict[str, set[str]]) -> None:
    """nats-server stopped for 20 s (a timer resumes it, whatever the POSTs are doing) while jobs are POSTed again
    with their keys, as a client retries; then every job once more once it is back."""
    nats = own._proc("nats-server")
    os.kill(nats.pid, signal.SIGSTOP)
    resume = threading.Timer(20.0, os.kill, (nats.pid, signal.SIGCONT))
    resume.start()
    try:
        post_all(url, dict(list(bodies.items())[:20]), answered)  # retries into the stall
    finally:
        resume.join()
    post_all(url, bodies, answered)


def fill(folder: Path, seconds: float) -> None:
    """Fill the tmpfs at `folder` for `seconds`, then free it."""
    filler = folder / "filler"
    with filler.open("wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
        except OSError:
            pass
    time.sleep(seconds)
    filler.unlink()


def restart(proc: Proc, ready: bool) -> None:
    """kill -9 a process and start it again (waiting until it is ready, for a service)."""
    proc.kill9()
    if ready:
        proc.start().wait_ready(60)
    else:
        time.sleep(2)
        proc.start()


def main(n_jobs: int, seconds: float, kinds: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        own = own_servers(tmp_path)
        marks = tmp_path / "marks"
        marks.mkdir()
        store = tmp_path / "home" / "attempts"
        disk = "disk" in kinds and os.geteuid() == 0
        if "disk" in kinds and not disk:
            print("disk: skipped (mounting a tmpfs needs root)")
        if disk:
            store.mkdir(parents=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(store)], check=True)
        cluster, scheduler, billing = start_stack(own.servers, tmp_path, *NODES)
        agent = cluster.procs["agent"]
        started = time.monotonic()
        answered: dict[str, set[str]] = {}
        try:
            bodies = keyed_bodies(marks, seconds, n_jobs)
            post_all(scheduler.url, bodies, answered)
            faults = []
            if "restarts" in kinds:
                faults += [
                    ("scheduler kill -9", lambda: restart(scheduler, ready=True)),
                    ("billing kill -9", lambda: restart(billing, ready=True)),
                    ("agent kill -9", lambda: restart(agent, ready=False)),
                    ("redis FLUSHALL", own.flushall),
                    ("nats-server restart", own.restart_nats),
                ]
            if "freeze" in kinds:
                faults.append(("agent SIGSTOP 45 s", lambda: freeze(agent, 45.0)))
            if "stall" in kinds:
                faults.append(("nats-server SIGSTOP 20 s, POSTs retried",
                               lambda: stall_nats(own, scheduler.url, bodies, answered)))
            if disk:
                faults.append((f"attempt store full ({DISK_MB} MB tmpfs) 15 s", lambda: fill(store, 15.0)))
            for name, fault in faults:
                time.sleep(max(2.0, seconds * 2))
                print(f"{time.monotonic() - started:6.1f} s  {name}", flush=True)
                fault()
            if "duplicates" in kinds:
                print(f"{time.monotonic() - started:6.1f} s  every job POSTed again with its key", flush=True)
                post_all(scheduler.url, bodies, answered)
            ids = sorted({i for got in answered.values() for i in got})
            deadline = time.monotonic() + max(300.0, n_jobs * seconds / 10)
            states: dict[str, str] = {}
            while time.monotonic() < deadline:
                try:
                    got = httpx.get(scheduler.url + "/v1/jobs", params={"limit": 1000}, timeout=10)
                except httpx.HTTPError:
                    got = None
                if got is not None and got.status_code == 200:
                    states = {j["job_id"]: j["state"] for j in got.json()}
                    if all(states.get(i) in ("succeeded", "failed", "rejected") for i in ids):
                        break
                time.sleep(1.0)
            elapsed = time.monotonic() - started
            stored = sum(1 for state in states.values() if state)  # every job the scheduler holds
            succeeded = sum(1 for i in ids if states.get(i) == "succeeded")
            stuck = sum(1 for i in ids if states.get(i) not in ("succeeded", "failed", "rejected"))
            twice = sum(1 for i in ids if len([r for r in runs(marks, i) if r.end is not None and not r.stopped]) > 1)
            overlap = sum(
                1
                for i in ids
                if any(a.end is None or a.end > b.start
                       for a, b in zip(runs(marks, i), runs(marks, i)[1:], strict=False))
            )
            keyed_twice = sum(1 for got in answered.values() if len(got) > 1)
            ran = sum(r.end - r.start for i in ids for r in runs(marks, i) if r.end is not None)
            print(f"faults: {', '.join(kinds)}; states: {dict(Counter(states.get(i, 'unknown') for i in ids))}")
            time.sleep(3.0)  # billing's last reports
            billed = sum(billed_seconds(billing.url, i) for i in ids)
            print(
                f"submitted {len(bodies)} keys / jobs stored {stored} / keys answered with two jobs {keyed_twice} / "
                f"succeeded {succeeded} / ran twice {twice} / overlapping attempts {overlap} / stuck {stuck}   "
                "(target: one job per key, ran twice 0, overlapping 0, stuck 0)"
            )
            print(
                f"billed {billed:.1f} GPU-s vs ran {ran:.1f} GPU-s by the jobs' own marks: "
                f"{(billed - ran) / ran * 100 if ran else 0:+.2f}%   (target: within 1%)"
            )
            print(
                f"wall {elapsed:.0f} s; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
                f"cpus {os.cpu_count()}"
            )
            good = not twice and not overlap and not stuck and not keyed_twice and stored == len(bodies)
            return 0 if good and abs(billed - ran) <= 0.01 * ran else 1
        finally:
            cluster.stop()
            own.local.stop()
            if disk:
                subprocess.run(["umount", "-l", str(store)], check=False)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=2.0, help="how long each job runs")
    ap.add_argument("--faults", default=",".join(KINDS), help=f"which, comma-separated, of {', '.join(KINDS)}")
    args = ap.parse_args()
    chosen = [k.strip() for k in args.faults.split(",") if k.strip()]
    if unknown := sorted(set(chosen) - set(KINDS)):
        ap.error(f"--faults: unknown {', '.join(unknown)} (known: {', '.join(KINDS)})")
    sys.exit(main(args.jobs, args.seconds, chosen))
