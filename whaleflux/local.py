"""`whaleflux up`: the whole system on one machine, no Docker.

Starts nats-server and redis-server from pip-installed binaries unless
NATS_URL / REDIS_URL are set, then the five services and a simulated fleet as
child processes; restarts a child that dies; stops everything on Ctrl-C or
SIGTERM, leaving no process behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from whaleflux.shared import access, localconfig
from whaleflux.shared.catalog import load_fleet
from whaleflux.shared.localconfig import SERVICES, LocalConfig
from whaleflux.shared.permissions import OPERATOR, Identity, stack_identities

from .client import DEFAULT_PORTS
from .servers import LocalServers, write_private

console = Console()
READY_TIMEOUT_S = 60.0
# How long a service (and nats-server, redis-server) has to end after SIGTERM before `up` kills it and says so;
# the agent has its jobs' stop grace plus AGENT_STOP_EXTRA_S. Services end in well under a second.
SERVICE_STOP_S = 3.0
AGENT_STOP_EXTRA_S = 2.0
CONSOLE_PORT = 8706


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = None
    restarts: int = 0
    next_restart: float = 0.0
    # Its HTTP port, bound and listening here for as long as `up` runs, handed to each start of the child.
    listener: socket.socket | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        fds: tuple[int, ...] = ()
        env = self.env
        if self.listener is not None:
            fds = (self.listener.fileno(),)
            env = {**env, "WHALEFLUX_HTTP_FD": str(self.listener.fileno())}
        # Its own session: a Ctrl-C in the terminal reaches `up` alone, which stops the children in order
        # (the agent first, while the bus still takes its jobs' reports).
        self.proc = subprocess.Popen(self.argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, pass_fds=fds)
        log.close()


# Who asks whom over HTTP (WHALEFLUX_<PEER>_URL; docker-compose.yml sets the same): billing asks inventory for
# ownership terms, alerting for its findings (cost guardians), the scheduler for lease ends; inventory asks
# billing for its price book (owned GPUs valued as billing charges them); the console reads every service for
# its own background reads (what a person does there carries that person's credential).
SERVICE_LINKS: dict[str, tuple[str, ...]] = {
    "billing": ("inventory",), "alerting": ("inventory",), "scheduler": ("inventory",), "inventory": ("billing",),
    "console": SERVICES,
}


def linked_env(name: str, services: dict[str, str]) -> dict[str, str]:
    """The WHALEFLUX_<PEER>_URL variables of service `name`, from the base URLs `services` (name -> URL)."""
    return {f"WHALEFLUX_{peer.upper()}_URL": services[peer] for peer in SERVICE_LINKS.get(name, ())}


def job_defaults(environ: dict[str, str] | None = None, euid: int | None = None,
                 prefix: str | None = None) -> tuple[dict[str, str], str]:
    """What `up` adds to its agent's environment, and the summary's line for it. Jobs run as the user who started
    `up` (root too: a single machine's own user), unless WHALEFLUX_JOB_USER or WHALEFLUX_JOB_USERS names another
    (a production `whaleflux agent` keeps its per-team default, docs/services/agent.md); and they find this
    environment's programs (`python`, `whaleflux`, what the venv installed) first on PATH."""
    environ = dict(os.environ) if environ is None else environ
    euid = os.geteuid() if euid is None else euid
    bin_dir = str(Path(sys.prefix if prefix is None else prefix) / "bin")
    path = [p for p in environ.get("PATH", os.defpath).split(os.pathsep) if p and p != bin_dir]
    added = {"PATH": os.pathsep.join([bin_dir, *path])}
    configured = [k for k in ("WHALEFLUX_JOB_USER", "WHALEFLUX_JOB_USERS") if environ.get(k)]
    no_root = environ.get("WHALEFLUX_ALLOW_ROOT_JOBS", "").strip().lower() in ("0", "false", "no", "off")
    if configured:
        who = f"as {' and '.join(f'{k}={environ[k]}' for k in configured)} says"
    elif euid == 0 and no_root:
        who = "as each team's own uid (WHALEFLUX_ALLOW_ROOT_JOBS is off, docs/services/agent.md)"
    else:
        import pwd

        try:
            name = pwd.getpwuid(euid).pw_name
        except KeyError:
            name = str(euid)
        added["WHALEFLUX_JOB_USER"] = name
        if euid == 0:
            added["WHALEFLUX_ALLOW_ROOT_JOBS"] = "true"
        who = f"as {name}, who started `up` (WHALEFLUX_JOB_USER names another)"
    return added, f"{who}; {bin_dir} first on PATH"


def listen(preferred: int) -> socket.socket:
    """A listening socket on `preferred`, else on a free port: bound here, so nobody can take it before the child
    serves on it (probing a port and binding it later leaves a window for another process)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", preferred))
    except OSError:
        sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def issue_identities(secrets_dir: Path, identities: list[Identity],
                     operator_password: str) -> list[tuple[Identity, str]]:
    """A password for each NATS identity, kept across runs in `secrets_dir`/nats-users.json, and each also in
    `secrets_dir`/<user>.nats for the one process that uses it (all mode 0600). The operator's is the CLI's,
    from the config file."""
    store = secrets_dir / "nats-users.json"
    known: dict[str, str] = json.loads(store.read_text()) if store.exists() else {}
    issued = []
    for identity in identities:
        password = operator_password if identity.user == OPERATOR else known.get(identity.user)
        issued.append((identity, password or secrets.token_urlsafe(24)))
    write_private(store, json.dumps({identity.user: password for identity, password in issued}, indent=2))
    for identity, password in issued:
        write_private(secrets_dir / f"{identity.user}.nats", password)
    return issued


# The HTTP credentials: the person's admin token (the CLI's, in config.json; a person logs in to the console with
# it) in the tokens file every process reads; each component's own admin token, accepted by itself only; and, for
# a component that calls another, a viewer token accepted only by the services it calls (SERVICE_LINKS).
COMPONENTS = (*SERVICES, "console", "agent")


def issue_http_tokens(secrets_dir: Path, admin_token: str) -> Path:
    """The tokens file (hashes) and each component's tokens (`<name>.admin`, `<name>.token`, 0600), kept across
    runs; tokens issued by `whaleflux tokens issue` stay in the file."""
    tokens = secrets_dir / "tokens.json"
    access.issue(tokens, "admin", "admin", token=admin_token)
    for name in COMPONENTS:
        for suffix in ("admin", "token") if name in SERVICE_LINKS else ("admin",):
            path = secrets_dir / f"{name}.{suffix}"
            # (An older `up` gave the console the people's admin token: a component never keeps that one.)
            if not path.exists() or path.read_text() == admin_token:
                write_private(path, access.new_token())
        if name in SERVICE_LINKS:
            access.issue(tokens, name, "viewer", services=SERVICE_LINKS[name],
                         token=(secrets_dir / f"{name}.token").read_text())
    return tokens


@dataclass
class Stack:
    cfg: LocalConfig
    state_dir: Path
    fleet: Path
    assets: Path | None = None
    nats_cluster: int = 1  # nats-servers `up` runs as one JetStream cluster (1: a single server)
    production: bool = False  # the services' WHALEFLUX_ENVIRONMENT: reads need a token, secrets are checked
    children: list[Child] = field(default_factory=list)
    servers: LocalServers | None = None
    stopping: bool = False
    hurry: bool = False  # a second Ctrl-C while stopping: kill what still runs
    # The NATS user each child connects as (its name: a service, "console", "agent"), when `up` runs the servers.
    nats_users: set[str] = field(default_factory=set)
    jobs_line: str = ""  # who jobs run as, and their PATH (job_defaults)

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WHALEFLUX_")}
        env.update(
            {
                "NATS_URL": self.cfg.nats_url or "",
                "REDIS_URL": self.cfg.redis_url or "",
                "WHALEFLUX_NATS_USER": self.cfg.nats_user,
                "WHALEFLUX_NATS_PASSWORD": self.cfg.nats_password,
                "WHALEFLUX_REDIS_PASSWORD": self.cfg.redis_password,
                "WHALEFLUX_TOKENS_FILE": str(self.state_dir / "secrets" / "tokens.json"),
                "WHALEFLUX_HOME": str(self.state_dir),
                "WHALEFLUX_ENVIRONMENT": "production" if self.production else "development",
            }
        )
        if self.servers is not None and self.servers.cluster is not None:
            env["WHALEFLUX_NATS_REPLICAS"] = str(min(3, self.nats_cluster))  # R3: every stream on three servers
        # Settings the user exported for the services (e.g. webhook URLs) pass through.
        env.update({k: v for k, v in os.environ.items() if k.startswith("WHALEFLUX_") and k not in env})
        return env

    def identity_env(self, env: dict[str, str], user: str) -> dict[str, str]:
        """`env` for the child that connects as NATS user `user` (a component's name): its own NATS password,
        admin token, token for the services it calls and audit log, each read from its file."""
        secrets_dir = self.state_dir / "secrets"
        env = {**env, "WHALEFLUX_ADMIN_TOKEN_FILE": str(secrets_dir / f"{user}.admin"),
               "WHALEFLUX_AUDIT_LOG": str(self.state_dir / "audit" / f"{user}.jsonl")}
        if (secrets_dir / f"{user}.token").exists():
            env["WHALEFLUX_API_TOKEN_FILE"] = str(secrets_dir / f"{user}.token")
        if user not in self.nats_users:
            return env  # servers from the environment: one user for all
        child = {k: v for k, v in env.items() if k != "WHALEFLUX_NATS_PASSWORD"}
        child.update({"WHALEFLUX_NATS_USER": user,
                      "WHALEFLUX_NATS_PASSWORD_FILE": str(self.state_dir / "secrets" / f"{user}.nats")})
        return child

    def start_servers(self) -> None:
        if os.environ.get("NATS_URL") and os.environ.get("REDIS_URL"):
            self.cfg.nats_url, self.cfg.redis_url = os.environ["NATS_URL"], os.environ["REDIS_URL"]
            # Their one user (not the `operator` of servers `up` ran before).
            self.cfg.nats_user = os.environ.get("WHALEFLUX_NATS_USER", LocalConfig().nats_user)
            self.cfg.nats_password = os.environ.get("WHALEFLUX_NATS_PASSWORD", "")
            self.cfg.redis_password = os.environ.get("WHALEFLUX_REDIS_PASSWORD", "")
            console.print(f"Using NATS at {self.cfg.nats_url} and Redis at {self.cfg.redis_url} from the environment")
            return
        console.print("starting nats-server (JetStream) and redis-server…")
        began = time.monotonic()
        # One NATS user per component, each allowed only what its part of the contract says (docs/security.md).
        nodes = [(node.cluster, node.name) for node in load_fleet(self.fleet).nodes()]
        identities = issue_identities(self.state_dir / "secrets", stack_identities(nodes), self.cfg.nats_password)
        self.nats_users = {identity.user for identity, _ in identities}
        self.cfg.nats_user = OPERATOR  # the CLI's, from the config file
        self.servers = LocalServers(
            self.state_dir / "servers", self.cfg.nats_user, self.cfg.nats_password, self.cfg.redis_password,
            identities=identities, nats_cluster=self.nats_cluster,
        ).start(nats_port=14222, redis_port=16379)
        self.cfg.nats_url, self.cfg.redis_url = self.servers.nats_url, self.servers.redis_url
        console.print(f"  NATS at {self.cfg.nats_url}, Redis at {self.cfg.redis_url} "
                      f"({time.monotonic() - began:.1f} s)")

    def start_children(self) -> None:
        issue_http_tokens(self.state_dir / "secrets", self.cfg.admin_token)
        env = self.base_env()
        logs = self.state_dir / "logs"
        for name in SERVICES:
            listener = listen(DEFAULT_PORTS[name])
            port = listener.getsockname()[1]
            self.cfg.services[name] = f"http://127.0.0.1:{port}"
            child_env = {**self.identity_env(env, name), "WHALEFLUX_HTTP_PORT": str(port)}
            if name == "alerting":
                child_env["WHALEFLUX_EXTERNAL_URL"] = self.cfg.services[name]
            if name == "inventory" and self.assets:
                child_env["WHALEFLUX_ASSETS_FILE"] = str(self.assets.resolve())
            self.children.append(
                Child(name, [sys.executable, "-m", "whaleflux", "service", name], child_env, logs / f"{name}.log",
                      listener=listener)
            )
        # The services each one asks over HTTP, wherever `up` put them (SERVICE_LINKS).
        for child in self.children:
            child.env.update(linked_env(child.name, self.cfg.services))
        # The console: web pages over the services' APIs (it reads job logs from WHALEFLUX_HOME, as the CLI does).
        console_listener = listen(CONSOLE_PORT)
        console_port = console_listener.getsockname()[1]
        self.cfg.services["console"] = f"http://127.0.0.1:{console_port}"
        self.children.append(
            Child("console", [sys.executable, "-m", "whaleflux", "service", "console"],
                  {**self.identity_env(env, "console"), "WHALEFLUX_HTTP_PORT": str(console_port),
                   **linked_env("console", self.cfg.services)},
                  logs / "console.log", listener=console_listener)
        )
        # The agent's HTTP port serves fault injection (`whaleflux sim inject`).
        # Its jobs run as this user, with this environment's bin first on PATH (job_defaults).
        agent_extra, self.jobs_line = job_defaults()
        agent_listener = listen(DEFAULT_PORTS["agent"])
        agent_port = agent_listener.getsockname()[1]
        self.cfg.services["agent"] = f"http://127.0.0.1:{agent_port}"
        # The console's node page clears the simulated fleet's injected faults through the agent.
        next(c for c in self.children if c.name == "console").env["WHALEFLUX_AGENT_URL"] = self.cfg.services["agent"]
        self.children.append(
            Child("agent", [sys.executable, "-m", "whaleflux", "agent", "--simulate", str(self.fleet)],
                  {**self.identity_env(env, "agent"), **agent_extra, "WHALEFLUX_HTTP_PORT": str(agent_port)},
                  logs / "agent.log",
                  listener=agent_listener)
        )
        self.cfg.save()
        console.print(f"starting {', '.join(SERVICES)} and the simulated fleet ({self.fleet.name}); "
                      f"logs in {logs}")
        for child in self.children:
            child.start()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        began = time.monotonic()
        deadline = began + timeout
        pending = set(SERVICES)
        with httpx.Client(timeout=1.0) as http:
            while pending and not self.stopping and time.monotonic() < deadline:
                for name in sorted(pending):
                    try:
                        if http.get(self.cfg.services[name] + "/readyz").status_code == 200:
                            pending.discard(name)
                            console.print(f"  {name} ready at {self.cfg.services[name]} "
                                          f"({time.monotonic() - began:.1f} s)")
                    except httpx.HTTPError:
                        pass
                self.supervise()
                time.sleep(0.3)
        for name in sorted(pending):
            log = self.state_dir / "logs" / f"{name}.log"
            console.print(f"[red]{name} not ready after {timeout:.0f}s; see {log}[/red]")
        return not pending

    def supervise(self) -> None:
        """Restart a child that died, with a growing pause."""
        now = time.monotonic()
        for child in self.children:
            if child.proc is None or child.proc.poll() is None:
                continue
            if child.next_restart == 0.0:
                delay = min(2 ** child.restarts, 30)
                child.next_restart = now + delay
                console.print(f"[yellow]{child.name} exited with {child.proc.returncode}; "
                              f"restarting in {delay}s[/yellow]")
            elif now >= child.next_restart:
                child.restarts += 1
                child.next_restart = 0.0
                child.start()

    def print_summary(self, ready: bool) -> None:
        table = Table(title="WhaleFlux is up" if ready else "WhaleFlux started (not all services ready)")
        table.add_column("component")
        table.add_column("where")
        table.add_row("NATS (JetStream)", self.cfg.nats_url or "")
        table.add_row("Redis", self.cfg.redis_url or "")
        for name in SERVICES:
            table.add_row(name, f"{self.cfg.services[name]}  (docs: {self.cfg.services[name]}/docs)")
        if "console" in self.cfg.services:
            table.add_row("console (web)",
                          f"{self.cfg.services['console']}  (log in with admin_token from the config file)")
        table.add_row("mode", "production: every read needs a token (docs/security.md)" if self.production
                      else "development: reads need no token (`up --production` for authenticated reads)")
        table.add_row("simulated fleet", str(self.fleet))
        if self.jobs_line:
            table.add_row("jobs run", self.jobs_line)
        if self.assets:
            table.add_row("declared assets", str(self.assets))
        table.add_row("config (0600)", str(localconfig.config_path()))
        if self.nats_users:
            table.add_row("NATS identities (0600)", f"{self.state_dir / 'secrets'}  (see docs/security.md)")
        table.add_row("logs", str(self.state_dir / "logs"))
        console.print(table)
        console.print("Try:  whaleflux submit --gpus 1 -- python -c \"print('hi')\"   (Ctrl-C here stops everything)")

    def stop(self) -> list[str]:
        """The agent first, while NATS and the services still run, so its jobs' ends reach JetStream; then the rest.

        Each is asked (SIGTERM) and given a few seconds (the whole stop takes under 5 s unless a job ignores its
        stop grace); one still running then is killed (SIGKILL) and named, with its log, so a hang is never
        silent. A second Ctrl-C (`hurry`) kills whatever still runs at once. Returns what was killed."""
        agents = [c for c in self.children if c.name == "agent"]
        # The agent gives each job its stop grace (WHALEFLUX_STOP_GRACE_S, 5 s by default), then reports it.
        grace = float(os.environ.get("WHALEFLUX_STOP_GRACE_S") or 5.0)
        killed = self._stop_children(agents, grace + AGENT_STOP_EXTRA_S)
        killed += self._stop_children([c for c in self.children if c not in agents], SERVICE_STOP_S)
        for child in killed:
            console.print(f"[red]{child.name} did not stop within its time; killed it (see {child.log_path})[/red]")
        names = [child.name for child in killed]
        if self.servers:
            for server in self.servers.stop(SERVICE_STOP_S):
                console.print(f"[red]{server} did not stop within {SERVICE_STOP_S:.0f} s; killed it[/red]")
                names.append(server)
        return names

    def _stop_children(self, children: list[Child], timeout_s: float) -> list[Child]:
        """SIGTERM, then SIGKILL whichever is still running after `timeout_s` (or at once on a second Ctrl-C);
        returns those killed."""
        running = [(c, c.proc) for c in children if c.proc is not None and c.proc.poll() is None]
        for _, proc in running:
            proc.terminate()
        deadline = time.monotonic() + timeout_s
        while any(proc.poll() is None for _, proc in running) and time.monotonic() < deadline and not self.hurry:
            time.sleep(0.05)
        killed = [child for child, proc in running if proc.poll() is None]
        for _, proc in running:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        return killed


def up(fleet: Path, assets: Path | None = None, nats_cluster: int = 1, production: bool = False) -> int:
    state_dir = localconfig.home()
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Two `up`s on one state folder would share the JetStream store and corrupt it.
    lock = open(state_dir / "up.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        console.print(f"[red]error:[/red] another `whaleflux up` is running with {state_dir}; "
                      "stop it first or set WHALEFLUX_HOME")
        return 1
    cfg = localconfig.load_or_create()
    cfg.services = {}
    stack = Stack(cfg, state_dir, fleet, assets, nats_cluster, production=production)

    def on_signal(signum, frame):  # noqa: ARG001
        if stack.stopping:
            stack.hurry = True  # a second Ctrl-C: no more waiting
        stack.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        stack.start_servers()
        stack.start_children()
        stack.print_summary(stack.wait_ready())
        while not stack.stopping:
            stack.supervise()
            time.sleep(0.5)
    finally:
        console.print("Stopping WhaleFlux…")
        began = time.monotonic()
        killed = stack.stop()
        console.print(f"Stopped in {time.monotonic() - began:.1f} s"
                      + (f"; killed (would not stop): {', '.join(killed)}" if killed else ""))
    return 0
