"""Harness for the lifecycle fault tests: servers this test owns (so it can stop, wipe and restart them),
jobs that write their own start and end marks, and the checks every fault must pass."""

from __future__ import annotations

import asyncio
import secrets
import shlex
import subprocess
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import httpx
from redis.asyncio import Redis

from whaleflux.servers import LocalServers, _wait_port, nats_server_binary, redis_server_binary

from .conftest import Servers
from .processes import ADMIN_TOKEN, Cluster, Proc, make_cluster, wait_until

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@dataclass
class OwnServers:
    """A nats-server and a redis-server owned by one test: they can be stopped, wiped and restarted."""

    local: LocalServers

    @property
    def servers(self) -> Servers:
        s = self.local
        return Servers(s.nats_url, s.redis_url, s.nats_user, s.nats_password, s.redis_password, "own")

    def _proc(self, binary: str) -> subprocess.Popen:
        def program(p: subprocess.Popen) -> str:
            first = p.args[0] if isinstance(p.args, (list, tuple)) else p.args
            return Path(str(first)).name

        return next(p for p in self.local.procs if program(p).startswith(binary))

    def stop_redis(self) -> None:
        proc = self._proc("redis-server")
        proc.terminate()
        proc.wait(15)
        self.local.procs.remove(proc)

    def start_redis(self) -> None:
        conf = self.local.state_dir / "redis.conf"
        proc = subprocess.Popen([redis_server_binary(), str(conf)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        self.local.procs.append(proc)
        _wait_port(self.local.redis_port, proc, "redis-server", self.local.state_dir / "redis-server.log")

    def flushall(self) -> None:
        async def flush():
            redis = Redis.from_url(self.local.redis_url, password=self.local.redis_password)
            await redis.flushall()
            await redis.aclose()
        asyncio.run(flush())

    def restart_nats(self) -> None:
        proc = self._proc("nats-server")
        proc.terminate()
        proc.wait(15)
        self.local.procs.remove(proc)
        # The same config (port, store, credentials): the clients reconnect to where it was.
        state = self.local.state_dir
        argv = [nats_server_binary(), "-c", str(state / "nats.conf"), "-l", str(state / "nats-server.log")]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.local.procs.append(proc)
        _wait_port(self.local.nats_port, proc, "nats-server", state / "nats-server.log")


def own_servers(tmp_path: Path) -> OwnServers:
    local = LocalServers(tmp_path / "servers", "whaleflux", secrets.token_urlsafe(16), secrets.token_urlsafe(16))
    return OwnServers(local.start())


def checkpointing_command(marks: Path, steps: int, step_s: float = 0.25) -> list[str]:
    """A job that counts `steps` steps, writing its step to its checkpoint dir atomically after each, and
    resumes from it; its marks are `start <attempt> <t> <first step> <WHALEFLUX_RESUME>`, `end`, `term`."""
    f = shlex.quote(str(marks)) + '/"$WHALEFLUX_JOB_ID"'
    ck = '"$WHALEFLUX_CHECKPOINT_DIR"'
    script = (
        f"""trap 'echo "term $WHALEFLUX_ATTEMPT $(date +%s.%N)" >> {f}; exit 143' TERM; """
        f"""s=0; [ "$WHALEFLUX_RESUME" = 1 ] && [ -f {ck}/step ] && s=$(cat {ck}/step); """
        f"""echo "start $WHALEFLUX_ATTEMPT $(date +%s.%N) $s $WHALEFLUX_RESUME" >> {f}; """
        f"""while [ "$s" -lt {steps} ]; do sleep {step_s} & wait $!; s=$((s+1)); """
        f"""echo "$s" > {ck}/step.tmp; mv {ck}/step.tmp {ck}/step; done; """
        f"""echo "end $WHALEFLUX_ATTEMPT $(date +%s.%N)" >> {f}"""
    )
    return ["sh", "-c", script]


def first_steps(marks: Path, job_id: str) -> list[tuple[int, int, str]]:
    """(attempt, first step, WHALEFLUX_RESUME) of each run of a checkpointing job."""
    path = marks / job_id
    lines = (line.split() for line in path.read_text().splitlines())
    return [(int(p[1]), int(p[3]), p[4]) for p in lines if p[0] == "start"]


# What a job's marks miss of its process's life, at most, an attempt: `sh` starting, and `date` run for the
# start and the end mark (9-28 ms measured per attempt with a load average of 5 on 2 cores).
MARKS_MISS_S = 0.03


def marked_command(marks: Path, seconds: float) -> list[str]:
    """A job that appends `start <attempt> <t>` and `end <attempt> <t>` to its own mark file (one short
    append each, atomic), and `term <attempt> <t>` if it is stopped."""
    f = shlex.quote(str(marks)) + '/"$WHALEFLUX_JOB_ID"'
    mark = lambda what: f'echo "{what} $WHALEFLUX_ATTEMPT $(date +%s.%N)" >> {f}'  # noqa: E731
    script = (f"trap '{mark('term')}; exit 143' TERM; {mark('start')}; sleep {seconds} & wait $!; {mark('end')}")
    return ["sh", "-c", script]


@dataclass
class Run:
    attempt: int
    start: float
    end: float | None  # None: stopped (a `term` mark) or never ended
    stopped: bool = False


def runs(marks: Path, job_id: str) -> list[Run]:
    """The job's runs as it recorded them itself."""
    path = marks / job_id
    out: list[Run] = []
    for line in path.read_text().splitlines() if path.exists() else []:
        what, attempt, t = line.split()[:3]
        if what == "start":
            out.append(Run(int(attempt), float(t), None))
        elif out and out[-1].attempt == int(attempt):
            out[-1].end, out[-1].stopped = float(t), what == "term"
    return out


def submit(scheduler_url: str, marks: Path, seconds: float, n: int, **spec) -> list[str]:
    ids = []
    for i in range(n):
        body = {"name": f"marked-{i}", "team": "faults", "command": marked_command(marks, seconds), **spec}
        r = httpx.post(scheduler_url + "/v1/jobs", json=body, headers=AUTH, timeout=10)
        assert r.status_code == 202, r.text
        ids.append(r.json()["job_id"])
    return ids


def jobs(scheduler_url: str) -> dict[str, dict]:
    return {j["job_id"]: j for j in httpx.get(scheduler_url + "/v1/jobs", params={"limit": 1000}, timeout=10).json()}


def wait_all_ended(scheduler_url: str, ids: list[str], timeout: float = 120) -> dict[str, dict]:
    def ended():
        r = httpx.get(scheduler_url + "/v1/jobs", params={"limit": 1000}, timeout=10)
        if r.status_code != 200:
            return None
        now = {j["job_id"]: j for j in r.json()}
        return all(now.get(i, {}).get("state") in ("succeeded", "failed", "rejected") for i in ids) and now
    return wait_until(ended, timeout=timeout, what="every job ended")


def assert_ran_once_each(marks: Path, ids: list[str], records: dict[str, dict]) -> None:
    """No finished job ran again, no two attempts of a job overlapped, every job succeeded."""
    for job_id in ids:
        mine = runs(marks, job_id)
        assert records[job_id]["state"] == "succeeded", (job_id, records[job_id], mine)
        completed = [r for r in mine if r.end is not None and not r.stopped]
        assert len(completed) == 1, f"{job_id} ran to its end {len(completed)} times: {mine}"
        for a, b in zip(mine, mine[1:], strict=False):
            overlap = f"{job_id}: attempt {b.attempt} started while {a.attempt} ran: {mine}"
            assert a.end is not None and a.end <= b.start, overlap


def billed_gpu_seconds(billing_url: str, job_id: str) -> Decimal:
    usage = httpx.get(f"{billing_url}/v1/costs/jobs/{job_id}", timeout=10).json()
    return sum((Decimal(u["gpu_seconds"]) for u in usage), Decimal(0))


def assert_billed_what_ran(billing_url: str, marks: Path, ids: list[str], timeout: float = 60) -> None:
    """Billed GPU-seconds equal what the jobs' own marks say ran, within 1% in all (one GPU each), plus
    `MARKS_MISS_S` an attempt over it: billing charges each attempt from its process's start to its exit,
    and the marks miss the shell's start and the `date` runs that write them.

    Billing hears of an attempt's end after the scheduler does: wait until every attempt is charged.
    """
    ran = {j: sum(r.end - r.start for r in runs(marks, j) if r.end is not None) for j in ids}
    attempts = {j: len(runs(marks, j)) for j in ids}

    def charged():
        usage = {j: httpx.get(f"{billing_url}/v1/costs/jobs/{j}", timeout=10).json() for j in ids}
        return all(len(usage[j]) == attempts[j] and all(u.get("ended_at") for u in usage[j]) for j in ids) and usage
    usage = wait_until(charged, timeout=timeout, what="every attempt charged to its end")
    got = {j: float(sum(Decimal(u["gpu_seconds"]) for u in usage[j])) for j in ids}
    total_ran, total_billed = sum(ran.values()), sum(got.values())
    over = total_billed - total_ran
    allowed = 0.01 * total_ran
    assert -allowed <= over <= allowed + MARKS_MISS_S * sum(attempts.values()), (total_billed, total_ran, got, ran)


def start_stack(servers: Servers, tmp_path: Path, *nodes: str, **scheduler_env: str) -> tuple[Cluster, Proc, Proc]:
    cluster = make_cluster(servers, tmp_path)
    scheduler = cluster.service("scheduler", **scheduler_env)
    billing = cluster.service("billing")
    cluster.agent(*nodes)
    scheduler.wait_ready()
    billing.wait_ready()
    wait_until(lambda: len(httpx.get(scheduler.url + "/v1/nodes").json()) == len(nodes), what="nodes registered")
    return cluster, scheduler, billing
