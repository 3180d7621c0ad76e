"""Real servers for the tests that need the bus or state.

Order of preference: NATS_URL and REDIS_URL from the environment; else
testcontainers when a Docker engine answers; else nats-server and redis-server
started here from the same pip-installed binaries `whaleflux up` uses.
Each test that asks for `clean_servers` starts from empty streams and an empty
Redis database — so point NATS_URL/REDIS_URL only at throwaway servers.

Every test is marked `unit` or `integration` (`dev.py test -m unit` runs the pure
cores in seconds): see `pytest_collection_modifyitems`. nats, redis and the
server helpers are imported inside the fixtures, so a unit run never loads them.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import secrets
import types
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from whaleflux.shared import access


@dataclass
class Servers:
    nats_url: str
    redis_url: str
    nats_user: str | None = None
    nats_password: str | None = None
    redis_password: str | None = None
    how: str = ""

    def env(self) -> dict[str, str]:
        """Environment for a WhaleFlux process talking to these servers."""
        env = {"NATS_URL": self.nats_url, "REDIS_URL": self.redis_url}
        if self.nats_user:
            env["WHALEFLUX_NATS_USER"] = self.nats_user
        if self.nats_password:
            env["WHALEFLUX_NATS_PASSWORD"] = self.nats_password
        if self.redis_password:
            env["WHALEFLUX_REDIS_PASSWORD"] = self.redis_password
        return env


def _docker_answers() -> bool:
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        return False
    try:
        docker.from_env(timeout=3).ping()
        return True
    except (DockerException, OSError):  # no engine, or it does not answer
        return False


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    if os.environ.get("NATS_URL") and os.environ.get("REDIS_URL"):
        yield Servers(
            os.environ["NATS_URL"],
            os.environ["REDIS_URL"],
            os.environ.get("WHALEFLUX_NATS_USER"),
            os.environ.get("WHALEFLUX_NATS_PASSWORD"),
            os.environ.get("WHALEFLUX_REDIS_PASSWORD"),
            how="environment",
        )
        return
    if _docker_answers():
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.waiting_utils import wait_for_logs

        nats_c = DockerContainer("nats:2.10-alpine").with_command("-js").with_exposed_ports(4222)
        redis_c = DockerContainer("redis:7-alpine").with_exposed_ports(6379)
        with nats_c, redis_c:
            wait_for_logs(nats_c, "Server is ready")
            wait_for_logs(redis_c, "Ready to accept connections")
            yield Servers(
                f"nats://{nats_c.get_container_host_ip()}:{nats_c.get_exposed_port(4222)}",
                f"redis://{redis_c.get_container_host_ip()}:{redis_c.get_exposed_port(6379)}/0",
                how="testcontainers",
            )
        return
    from whaleflux.servers import LocalServers

    local = LocalServers(
        tmp_path_factory.mktemp("servers"), "whaleflux", secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    ).start()
    try:
        yield Servers(local.nats_url, local.redis_url, local.nats_user, local.nats_password, local.redis_password,
                      "local")
    finally:
        local.stop()


async def _wipe(s: Servers) -> None:
    import nats
    import nats.js.errors
    from redis.asyncio import Redis

    from whaleflux.shared.streams import STREAMS

    nc = await nats.connect(s.nats_url, user=s.nats_user, password=s.nats_password)
    js = nc.jetstream()
    for name in STREAMS:
        try:
            await js.delete_stream(name)
        except nats.js.errors.NotFoundError:  # never declared on this server
            pass
    await nc.close()
    redis = Redis.from_url(s.redis_url, password=s.redis_password)
    await redis.flushdb()
    await redis.aclose()


@pytest.fixture
def clean_servers(servers: Servers) -> Servers:
    """The servers, with no WhaleFlux streams and an empty Redis database."""
    asyncio.run(_wipe(servers))
    return servers


@pytest.fixture
def env(clean_servers: Servers, monkeypatch: pytest.MonkeyPatch) -> Servers:
    """Emptied servers, their URLs and credentials in this process's environment (for in-process services)."""
    for key, value in clean_servers.env().items():
        monkeypatch.setenv(key, value)
    return clean_servers


@pytest.fixture
def wf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("WHALEFLUX_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
async def bus_and_redis(clean_servers: Servers) -> AsyncIterator[tuple[Any, Any]]:
    """A test's own bus connection (streams declared) and Redis client, on emptied servers."""
    from redis.asyncio import Redis

    from .processes import connect_bus

    bus = await connect_bus(clean_servers)
    redis = Redis.from_url(clean_servers.redis_url, password=clean_servers.redis_password, decode_responses=True)
    yield bus, redis
    await bus.close()
    await redis.aclose()


# What makes a test an integration test: the real servers (every server fixture depends on `servers`), or code
# that starts processes or a browser, in the test or in the fixtures and test helpers it uses.
SERVER_FIXTURES = frozenset({"servers"})
INTEGRATION_MODULES = ("subprocess", "multiprocessing", "playwright", "testcontainers", "whaleflux.servers",
                       "tests.processes", "tests.lifecycle")
INTEGRATION_CALLS = frozenset({"create_subprocess_exec", "create_subprocess_shell"})


def pytest_configure(config: pytest.Config) -> None:
    from .rootjobs import ROOT_JOBS

    # Agents built in the test process read their settings from here (the child processes: processes.py).
    for key, value in ROOT_JOBS.items():
        os.environ.setdefault(key, value)
    config.addinivalue_line("markers", "unit: a pure test: no servers, processes or browser (marked automatically)")
    config.addinivalue_line("markers", "integration: real NATS/Redis, processes or a browser (marked automatically)")


def _integration_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in INTEGRATION_MODULES)


def _uses_processes(function: Any, seen: set[Any]) -> bool:
    """Whether `function`, or a test helper it names (followed through tests/), starts processes or a browser."""
    function = inspect.unwrap(function)
    code = getattr(function, "__code__", None)
    if code is None or function in seen:
        return False
    seen.add(function)
    namespace = getattr(function, "__globals__", {})
    codes = [code]
    while codes:
        current = codes.pop()
        codes.extend(c for c in current.co_consts if isinstance(c, types.CodeType))  # inner functions, lambdas
        for name in current.co_names:
            if name in INTEGRATION_CALLS or _integration_module(name):  # also `import x` inside a function
                return True
            value = namespace.get(name)
            origin = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
            if not isinstance(origin, str):
                continue
            if _integration_module(origin):
                return True
            if origin.startswith("tests.") and callable(value) and _uses_processes(value, seen):
                return True
    return False


def _is_integration(item: pytest.Function) -> bool:
    if SERVER_FIXTURES & set(item.fixturenames):  # the closure: fixtures of fixtures too
        return True
    seen: set[Any] = set()
    fixture_functions = [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]
    return any(_uses_processes(f, seen) for f in [item.function, *fixture_functions])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test `unit` or `integration` by what it uses; an explicit marker on a test wins."""
    for item in items:
        if not isinstance(item, pytest.Function) or item.get_closest_marker("unit") \
                or item.get_closest_marker("integration"):
            continue
        item.add_marker(pytest.mark.integration if _is_integration(item) else pytest.mark.unit)


@pytest.fixture
def people(tmp_path: Path) -> dict[str, str]:
    """A tokens file (its path under "path") with one person of each role and a component's token scoped to
    inventory (tests/test_access_live.py, tests/test_console_people.py)."""
    path = tmp_path / "tokens.json"
    return {
        "path": str(path),
        "viewer": access.issue(path, "vic", "viewer"),
        "submitter": access.issue(path, "sam", "submitter", teams=["vision"]),
        "operator": access.issue(path, "olga", "operator"),
        "admin": access.issue(path, "ada", "admin"),
        "scheduler": access.issue(path, "scheduler", "viewer", services=["inventory"]),
    }
