"""The service runtime: what it answers before it is connected, which errors become 400, the admin check,
the injected clock, and a start against real NATS and Redis."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import httpx
import pytest
from fastapi import APIRouter, Request
from pydantic import SecretStr
from structlog.testing import capture_logs

from whaleflux.shared import subjects
from whaleflux.shared.deps import Admin, AdminDep, NowDep, RuntimeDep, StateDep, runtime_of
from whaleflux.shared.events import Envelope, EventData, NodeDrainRequested
from whaleflux.shared.runtime import BadRequest, Runtime, ServiceParts, StateUnavailable
from whaleflux.shared.settings import CommonSettings

TOKEN = "t" * 24
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _settings() -> CommonSettings:
    return CommonSettings(admin_token=SecretStr(TOKEN))


def _router() -> APIRouter:
    router = APIRouter()

    @router.get("/v1/bad")
    async def bad() -> dict[str, str]:
        raise BadRequest("field 'team': unknown team 'x'")

    @router.get("/v1/bug")
    async def bug() -> dict[str, str]:
        raise ValueError("an internal bug, not the client's fault")

    @router.get("/v1/store")
    async def store(request: Request) -> dict[str, int]:
        return {"keys": await runtime_of(request).redis.dbsize()}

    @router.get("/v1/whole", dependencies=[StateDep])
    async def whole() -> dict[str, bool]:
        return {"whole": True}

    @router.post("/admin/a", dependencies=[AdminDep])
    async def admin_a() -> dict[str, str]:
        return {"ok": "a"}

    @router.post("/admin/b")
    async def admin_b(_: Admin, runtime: RuntimeDep) -> dict[str, str]:
        return {"ok": runtime.name}

    @router.get("/v1/now")
    async def now(at: NowDep) -> dict[str, str]:
        return {"now": at.isoformat()}

    return router


def _client(app: object) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://svc")


async def test_only_bad_request_is_a_400_and_a_plain_value_error_is_a_500():
    runtime = Runtime("svc", _settings(), clock=lambda: T0)
    async with _client(runtime.app(ServiceParts(routers=[_router()]))) as http:
        bad = await http.get("/v1/bad")
        bug = await http.get("/v1/bug")
    assert bad.status_code == 400 and bad.json() == {"detail": "field 'team': unknown team 'x'"}
    assert bug.status_code == 500


async def test_before_connect_the_store_the_bus_and_the_outbox_are_unavailable_and_the_api_says_503():
    runtime = Runtime("svc", _settings())
    for part in ("redis", "bus", "outbox"):
        with pytest.raises(StateUnavailable, match="not connected"):
            getattr(runtime, part)
    with pytest.raises(StateUnavailable, match="starting"):
        runtime.require_state()
    async with _client(runtime.app(ServiceParts(routers=[_router()]))) as http:
        store = await http.get("/v1/store")
        whole = await http.get("/v1/whole")
    assert store.status_code == 503 and store.headers["Retry-After"] == "2"
    assert "not connected to its store" in store.json()["detail"]
    assert whole.status_code == 503 and "starting" in whole.json()["detail"]


async def test_admin_routes_need_the_bearer_token_in_either_form_of_the_dependency():
    runtime = Runtime("svc", _settings())
    async with _client(runtime.app(ServiceParts(routers=[_router()]))) as http:
        for path in ("/admin/a", "/admin/b", "/admin/status"):
            method = http.get if path == "/admin/status" else http.post
            assert (await method(path)).status_code == 401
            wrong = await method(path, headers={"Authorization": "Bearer " + "x" * 24})
            assert wrong.status_code == 401 and wrong.headers["WWW-Authenticate"] == "Bearer"
            ok = await method(path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert ok.status_code == 200, path
        assert (await http.post("/admin/b", headers={"Authorization": f"Bearer {TOKEN}"})).json() == {"ok": "svc"}
        status = (await http.get("/admin/status", headers={"Authorization": f"Bearer {TOKEN}"})).json()
    assert status["settings"]["admin_token"] == "********"


async def test_now_comes_from_the_injected_clock_and_envelopes_are_timed_by_it():
    runtime = Runtime("svc", _settings(), clock=lambda: T0)
    async with _client(runtime.app(ServiceParts(routers=[_router()]))) as http:
        assert (await http.get("/v1/now")).json() == {"now": T0.isoformat()}
    env = runtime.envelope(NodeDrainRequested(cluster="c", node="n", reason="r"), subject="c/n")
    assert env.time == T0 and env.source == f"whaleflux/svc/{runtime.settings.instance}" and env.subject == "c/n"


async def test_a_started_runtime_loads_binds_its_consumers_is_ready_and_publishes_what_it_staged(env):
    seen: list[EventData] = []
    loaded = asyncio.Event()

    async def on_drain(envelope: Envelope, data: EventData) -> None:
        seen.append(data)

    async def on_ready() -> None:
        loaded.set()

    runtime = Runtime("alerting", _settings(), clock=lambda: T0)
    app = runtime.app(ServiceParts(consumers={"scheduler-nodes": on_drain}, routers=[_router()], on_ready=on_ready,
                                   state={"answer": 42}))
    assert app.state.answer == 42 and app.state.runtime is runtime
    await asyncio.wait_for(runtime.start(), 30)  # fail, not hang, if the servers are unreachable
    try:
        assert loaded.is_set() and runtime.epoch is not None
        async with _client(app) as http:
            async def ready() -> bool:
                return (await http.get("/readyz")).status_code == 200
            await _until(ready, "ready")
            assert (await http.get("/v1/whole")).json() == {"whole": True}
        drain = NodeDrainRequested(cluster="onprem", node="n1", reason="test")
        async with runtime.redis.pipeline(transaction=True) as pipe:
            runtime.outbox.stage(pipe, subjects.node_drain_requested("onprem", "n1"), runtime.envelope(drain))
            await pipe.execute()
        await runtime.publish_staged()

        async def handled() -> bool:
            return seen == [drain]
        await _until(handled, "the staged event consumed")

        # A consumer whose delivery loop ended (here: cancelled) takes nothing: the service is not ready.
        _, loop = runtime.bus._consumers["scheduler-nodes"]
        loop.cancel()
        async with _client(app) as http:
            async def not_ready() -> bool:
                answer = await http.get("/readyz")
                return answer.status_code == 503 and answer.json()["checks"]["consumer:scheduler-nodes"] is False
            await _until(not_ready, "readyz naming the ended consumer")
    finally:
        await runtime.stop()


async def test_a_store_wiped_while_running_is_rebuilt_by_replay_and_the_service_decides_again(env):
    seen: list[str] = []
    loads = 0

    async def on_drain(envelope: Envelope, data: EventData) -> None:
        seen.append(envelope.id)

    async def on_ready() -> None:
        nonlocal loads
        loads += 1

    runtime = Runtime("alerting", _settings(), clock=lambda: T0)
    runtime.app(ServiceParts(consumers={"scheduler-nodes": on_drain}, on_ready=on_ready))
    await asyncio.wait_for(runtime.start(), 30)
    try:
        first = runtime.epoch
        drain = runtime.envelope(NodeDrainRequested(cluster="onprem", node="n1", reason="test"), event_id="d1")
        await runtime.bus.publish_envelope(subjects.node_drain_requested("onprem", "n1"), drain)

        async def handled_once() -> bool:
            return seen == ["d1"]
        await _until(handled_once, "the event handled")
        await runtime.redis.flushdb()  # the state (and its dedup markers) gone under a running service

        async def rebuilt() -> bool:
            return runtime.epoch not in (None, first) and runtime.state_ready.is_set()
        await _until(rebuilt, "a new state epoch")

        async def replayed() -> bool:
            return seen == ["d1", "d1"]  # the history consumer replayed its stream into the new state
        await _until(replayed, "the stream replayed")
        assert loads == 2  # what the service keeps in memory was loaded again after the rebuild
    finally:
        await runtime.stop()


async def _until(check, what: str, deadline_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not await check():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_stop_ends_even_when_a_task_swallows_its_cancellation_and_names_that_task():
    """A background loop that catches CancelledError and goes on must not hang the service's stop."""
    runtime = Runtime("test", _settings())
    runtime.stop_timeout_s = 0.5
    release = asyncio.Event()
    cancelled = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:  # the bug this guards against
                cancelled.set()

    async def polite() -> None:
        await asyncio.sleep(3600)

    bad, good = runtime.spawn(stubborn(), name="stubborn-loop"), runtime.spawn(polite(), name="polite-loop")
    try:
        await asyncio.sleep(0)
        with capture_logs() as logs:
            await runtime.stop()
        assert cancelled.is_set() and not bad.done()
        assert good.cancelled()
        assert [(e["event"], e["task"]) for e in logs if e["log_level"] == "error"] == [
            ("runtime.task_would_not_stop", "stubborn-loop")]
    finally:
        release.set()
        bad.cancel()
        await asyncio.wait([bad], timeout=5)
    assert bad.done()


async def test_the_placement_loop_ends_when_its_stop_meets_a_wake_up():
    """The scheduler's placement loop waits on `dirty` with a timeout. A job's end handled as the service stops
    sets `dirty` in the same turn as the stop's cancellation: on Python 3.11 `asyncio.wait_for` returned the
    event then and swallowed the cancellation, and the loop went on, hanging the scheduler's shutdown."""
    from services.scheduler.app import build
    from services.scheduler.settings import SchedulerSettings

    _, scheduler = build(SchedulerSettings(environment="development"))
    placement_loop = scheduler.runtime.parts.background[0]
    assert placement_loop.__name__ == "loop"
    task: asyncio.Future[None] = asyncio.ensure_future(placement_loop())
    for _ in range(5):
        await asyncio.sleep(0)  # it waits on `dirty` now
    scheduler.dirty.set()
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=5)
    try:
        assert done and task.cancelled()
    finally:
        task.cancel()
