"""Run WhaleFlux services and agents as real child processes in tests."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx

from whaleflux.servers import free_port

from .rootjobs import ROOT_JOBS

ADMIN_TOKEN = "test-admin-token-0123456789"


class Clock:
    """An injectable clock that stands still until a test moves `now`."""

    def __init__(self, now: datetime):
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    port: int | None = None
    popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The started process (start() first)."""
        if self.popen is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.popen

    def start(self) -> Proc:
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until /readyz answers 200. The deadline only catches a hang: a loaded machine starts services slowly."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = self.log_path.read_text()[-3000:]
                raise RuntimeError(f"{self.name} exited {self.process.returncode}:\n{log}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} not ready in {timeout}s:\n{self.log_path.read_text()[-3000:]}")

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.popen and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


@dataclass
class Cluster:
    """A set of WhaleFlux processes against one pair of servers."""

    base_env: dict[str, str]
    log_dir: Path
    procs: dict[str, Proc] = field(default_factory=dict)

    def service(self, name: str, replica: str | None = None, **extra_env: str) -> Proc:
        """Service `name` as a process; `replica` tells several of one service apart (`procs["<name>-<replica>"]`)."""
        port = free_port()
        env = {**self.base_env, "WHALEFLUX_HTTP_PORT": str(port), **extra_env}
        key = f"{name}-{replica}" if replica else name
        proc = Proc(key, [sys.executable, "-m", "whaleflux", "service", name], env, self.log_dir / f"{key}.log", port)
        self.procs[key] = proc.start()
        return proc

    def agent(self, *nodes: str, interval_s: float = 1.0, name: str = "agent", http: bool = False,
              fleet: Path | None = None, **extra_env: str) -> Proc:
        """An agent process for the nodes; `name` tells several apart, `http` gives it a port (fault injection),
        `fleet` a fleet file other than the default one, `extra_env` its settings."""
        argv = [sys.executable, "-m", "whaleflux", "agent"] + (["--simulate", str(fleet)] if fleet else [])
        for node in nodes:
            argv += ["--node", node]
        env = {**self.base_env, "WHALEFLUX_INTERVAL_S": str(interval_s), **extra_env}
        port = free_port() if http else None
        if port:
            env["WHALEFLUX_HTTP_PORT"] = str(port)
        proc = Proc(name, argv, env, self.log_dir / f"{name}.log", port)
        self.procs[name] = proc.start()
        return proc

    def cli_env(self) -> dict[str, str]:
        env = dict(self.base_env)
        for name, proc in self.procs.items():
            if proc.port:
                env[f"WHALEFLUX_{name.upper()}_URL"] = proc.url
        return env

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "whaleflux", *args], env=self.cli_env(), capture_output=True, text=True,
            timeout=timeout,
        )

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.stop()


def make_cluster(servers, tmp_path: Path) -> Cluster:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WHALEFLUX_", "NATS_", "REDIS_"))}
    env.update(servers.env())
    env.update(
        {
            "WHALEFLUX_ADMIN_TOKEN": ADMIN_TOKEN,
            "WHALEFLUX_HOME": str(tmp_path / "home"),
            "WHALEFLUX_ENVIRONMENT": "development",
            **ROOT_JOBS,
        }
    )
    log_dir = tmp_path / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    return Cluster(env, log_dir)


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.2, what: str = "condition"):
    """Poll `predicate` until it returns something truthy; return that value."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - keep polling, report the last error
            last_exc = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}" + (f" (last error: {last_exc!r})" if last_exc else ""))


async def until(predicate, timeout: float = 15.0, what: str = "condition"):
    """In async tests: poll `predicate` (plain or async) until it returns something truthy; return that."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.02)
    raise TimeoutError(f"timed out waiting for {what}")


async def connect_bus(servers):
    """A test's own connection to the bus, with every stream declared."""
    from whaleflux.shared.bus import Bus

    bus = await Bus.connect(servers.nats_url, source="test", user=servers.nats_user, password=servers.nats_password)
    await bus.ensure_streams()
    return bus


async def fetch_at_least(sub, n: int, timeout: float = 30.0) -> list:
    """Pull from a JetStream pull subscription until `n` messages came or the deadline passed; return them all."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    got: list = []
    while len(got) < n and loop.time() < deadline:
        try:
            got += await sub.fetch(n - len(got), timeout=min(1.0, max(0.05, deadline - loop.time())))
        except TimeoutError:  # nats.errors.TimeoutError (and asyncio's) is a TimeoutError: nothing yet, ask again
            pass
    return got


async def fetch_stored(sub, batch: int = 500, quiet_s: float = 1.0) -> list:
    """Every message a pull subscription has stored: fetch until one fetch waits `quiet_s` and gets nothing."""
    got: list = []
    while True:
        try:
            got += await sub.fetch(batch, timeout=quiet_s)
        except TimeoutError:  # nothing more stored; a dropped connection raises something else and fails the test
            return got
