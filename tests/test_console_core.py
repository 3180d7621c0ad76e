"""The console's pure parts: sessions and CSRF, the heat map's cells, coalesced live views, no CDN anywhere."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from pathlib import Path

from whaleflux.console.auth import Person, Sessions, Signer, safe_next
from whaleflux.console.heatmap import BUSY, ERROR, HOT, STALE, decode_cells
from whaleflux.console.live import LiveHub, encode

ROOT = Path(__file__).resolve().parents[1]


def test_a_session_cookie_is_accepted_until_it_expires_and_only_with_its_own_signature():
    signer = Signer("admin-token-0123456789")
    session, cookie = signer.new_session(3600, now=1000.0)
    assert signer.session(cookie, now=2000.0) == session
    assert signer.session(cookie, now=5000.0) is None  # expired
    sid, expires, mac = cookie.split(".")
    assert signer.session(f"{sid}.{int(expires) + 9999}.{mac}", now=2000.0) is None  # lifetime extended by hand
    assert Signer("another-token-0123456789").session(cookie, now=2000.0) is None  # token rotated: sessions end
    assert "admin-token" not in cookie


def test_a_sessions_person_and_credential_live_on_the_server_until_it_ends_expires_or_makes_room():
    signer, sessions = Signer("admin-token-0123456789"), Sessions(limit=2)
    first, cookie = signer.new_session(3600, now=1000.0)
    sessions.add(first, Person("vic", "viewer", "token", "wf_secret-of-vic"), now=1000.0)
    assert "wf_secret" not in cookie and "vic" not in cookie
    assert sessions.person(first, now=2000.0) == Person("vic", "viewer", "token", "wf_secret-of-vic")
    assert "wf_secret" not in repr(sessions.person(first, now=2000.0))  # never in a log line
    assert sessions.person(first, now=5000.0) is None  # expired, and forgotten
    short, _ = signer.new_session(3600, now=1000.0, ends=1500.0)  # an OIDC token's exp comes first
    assert short.expires == 1500
    a, _ = signer.new_session(3600, now=1000.0)
    b, _ = signer.new_session(3600, now=1000.0)
    c, _ = signer.new_session(3600, now=1000.0)
    for s in (a, b, c):
        sessions.add(s, Person(s.sid, "viewer", "token", "t"), now=1000.0)
    assert len(sessions) == 2 and sessions.person(a, now=1001.0) is None  # full: the oldest made room
    sessions.end(b)
    assert sessions.person(b, now=1001.0) is None and sessions.person(c, now=1001.0) is not None


def test_csrf_tokens_are_bound_to_their_session():
    signer = Signer("admin-token-0123456789")
    mine, _ = signer.new_session(3600)
    theirs, _ = signer.new_session(3600)
    assert signer.csrf_ok(mine, mine.csrf(signer.key))
    assert not signer.csrf_ok(mine, theirs.csrf(signer.key))
    assert not signer.csrf_ok(mine, None) and not signer.csrf_ok(mine, "")


def test_after_login_only_local_paths_are_followed():
    assert safe_next("/jobs?state=running") == "/jobs?state=running"
    for bad in ("https://evil.example/", "//evil.example/x", "/\\evil.example", "", None):
        assert safe_next(bad) == "/"


def _entry(node: str, index: int, util: float, temp: float, at: float, **extra: object):
    from whaleflux.console.fleetfold import gpu_entry
    from whaleflux.shared.events import GpuSample

    gpu = GpuSample.model_validate({"uuid": f"GPU-{node}-{index}", "index": index, "model": "H100",
                                    "utilization_gpu_pct": util, "memory_used_mib": 1024, "memory_total_mib": 81559,
                                    "temperature_c": temp, "slowdown_temperature_c": 90, "power_w": 100, **extra})
    return gpu_entry("c", node, datetime.fromtimestamp(at, UTC), at, gpu, None)


def test_heat_map_cells_are_grouped_by_node_in_index_order_with_their_flags():
    from whaleflux.console.fleetfold import NodeEntry, fleet_numbers

    now = 1_000_000.0
    a, b = NodeEntry("c", "a"), NodeEntry("c", "b")
    b.put(_entry("b", 1, 50, 45, now, ecc_uncorrected=1))
    a.put(_entry("a", 0, 99.6, 90, now))
    b.put(_entry("b", 0, 0, 30, now - 60))  # silent for a minute: stale
    held = {"GPU-a-0": "job-1"}
    numbers = fleet_numbers([a, b], now, 15, held, {"b": "draining"})
    layout = json.loads(numbers.heat)
    assert (layout["gpus"], layout["nodes"]) == (3, [["a", "unknown", 1], ["b", "draining", 2]])
    assert decode_cells(numbers.cells) == (layout["v"], [(100, 100, HOT | BUSY), (0, 33, STALE), (50, 50, ERROR)])
    s = numbers.summary
    assert (s.gpus, s.nodes, s.stale, s.hot, s.erroring, s.with_job, s.power_w) == (3, 2, 1, 1, 1, 1, 300)
    assert [(n.node, n.gpus, n.util_mean_pct, n.flagged_gpus, n.stale) for n in numbers.nodes] == [
        ("a", 1, 99.6, 1, False), ("b", 2, 25, 2, False)]

    # Nothing it shows changed: the same node texts again, not built anew. A job ending changes its node only.
    again = fleet_numbers([a, b], now + 1, 15, {}, {"b": "draining"})
    assert again.nodes[1] is numbers.nodes[1] and again.nodes[0] is not numbers.nodes[0]
    assert again.heat == numbers.heat  # the same layout: the live view does not send it again
    assert decode_cells(again.cells)[1][0] == (100, 100, HOT)
    drained = fleet_numbers([a, b], now + 1, 15, {}, {"a": "draining", "b": "draining"})
    version = json.loads(drained.heat)["v"]
    assert version != layout["v"] and decode_cells(drained.cells)[0] == version  # the cells name their layout
    # A name is safe inside the page's <script> element.
    odd = NodeEntry("c", "</script>")
    odd.put(_entry("</script>", 0, 1, 1, now))
    assert "</script>" not in fleet_numbers([odd], now, 15, {}, {}).heat


def test_fifty_browsers_on_one_view_cost_one_build_per_tick():
    async def scenario() -> tuple[int, list[int]]:
        hub = LiveHub(interval_s=0.2)
        builds = 0

        async def render():
            nonlocal builds
            builds += 1
            return [("fleet", f"<p>build {builds}</p>")]

        streams = [hub.stream("fleet", {"gpu"}, render) for _ in range(50)]
        for s in streams:
            assert await s.__anext__() == ": connected\n\n"
        runner = asyncio.create_task(hub.run())
        got = await asyncio.gather(*(s.__anext__() for s in streams))  # the first build reaches everyone
        for _ in range(3):  # a burst of events between ticks is one more build
            hub.mark("gpu")
        await asyncio.gather(*(s.__anext__() for s in streams))
        runner.cancel()
        for s in streams:
            await s.aclose()
        assert not hub.views  # nobody watches: the view is gone
        return builds, [len(set(got))]

    builds, distinct = asyncio.run(scenario())
    assert builds == 2 and distinct == [1]


def test_a_view_sends_only_the_frames_that_changed_and_a_browser_that_joins_gets_them_all():
    async def scenario() -> None:
        hub = LiveHub(interval_s=0.05)
        builds = 0
        third = asyncio.Event()

        async def render():
            nonlocal builds
            builds += 1
            if builds == 3:
                third.set()
            return [("layout", "names"), ("cells", f"cells {min(builds, 2)}")]

        first = hub.stream("fleet", {"gpu"}, render)
        assert await first.__anext__() == ": connected\n\n"
        runner = asyncio.create_task(hub.run())
        assert await first.__anext__() == encode("layout", "names") + encode("cells", "cells 1")
        hub.mark("gpu")
        assert await first.__anext__() == encode("cells", "cells 2")  # the layout did not change: not sent again
        hub.mark("gpu")
        await asyncio.wait_for(third.wait(), 30)  # built again, nothing changed: nothing sent (checked below)
        late = hub.stream("fleet", {"gpu"}, render)
        assert await late.__anext__() == ": connected\n\n"
        assert await late.__anext__() == encode("layout", "names") + encode("cells", "cells 2")
        assert all(q.empty() for q in hub.views["fleet"].queues)  # the third build sent nothing to anyone
        runner.cancel()
        await first.aclose()
        await late.aclose()

    asyncio.run(scenario())


def test_server_sent_events_put_every_line_in_its_own_data_field():
    assert encode("jobs", "<tr>\n<td>1</td>\n</tr>") == "event: jobs\ndata: <tr>\ndata: <td>1</td>\ndata: </tr>\n\n"


def test_no_page_script_or_style_comes_from_another_host():
    """Air-gapped: every script, style sheet and font is served by the console itself."""
    console = ROOT / "services" / "console"
    external = re.compile(r"""(src|href)=["'](https?:)?//""")
    for path in [*console.glob("templates/*.html"), *console.glob("static/*.js"), *console.glob("static/*.css")]:
        assert not external.search(path.read_text()), f"{path.name} loads something from another host"
        assert "fonts.googleapis" not in path.read_text()
    vendored = (console / "static" / "vendor" / "VENDORED.md").read_text()
    for name in ("htmx-2.0.11.min.js", "htmx-ext-sse-2.2.4.js", "uPlot-1.6.32.iife.min.js"):
        assert (console / "static" / "vendor" / name).exists() and name in vendored
    for licence in ("htmx.LICENSE", "htmx-ext-sse.LICENSE", "uPlot.LICENSE"):
        assert (console / "static" / "vendor" / licence).stat().st_size > 100


def test_the_agents_api_docs_load_vendored_assets_not_a_cdn(monkeypatch):
    from fastapi.testclient import TestClient

    from whaleflux.agent.app import AgentSettings, create_app

    monkeypatch.setenv("WHALEFLUX_ENVIRONMENT", "development")
    client = TestClient(create_app([], AgentSettings()))
    for path, asset in (("/docs", "/_apidocs/swagger-ui/swagger-ui-bundle.js"),
                        ("/redoc", "/_apidocs/redoc/redoc.standalone.js")):
        html = client.get(path).text
        assert asset in html and "cdn.jsdelivr" not in html and "fonts.googleapis" not in html
        # ReDoc's bundle still names a logo on a CDN: the browser is told to fetch from this host only.
        assert client.get(path).headers["content-security-policy"].startswith("default-src 'self'")
        assert client.get(asset).status_code == 200


def test_a_page_of_a_long_list_is_clamped_to_the_pages_there_are():
    from whaleflux.console.paging import page_of

    items = list(range(250))
    second = page_of(items, 2, 100)
    shown = (second.items[0], second.first, second.last, second.pages, second.previous, second.next)
    assert shown == (100, 101, 200, 3, 1, 3)
    assert page_of(items, 99, 100).items == items[200:] and page_of(items, 99, 100).next is None
    assert page_of(items, 0, 100).number == 1
    assert page_of([], 1, 100).first == 0 and page_of([], 1, 100).pages == 1


def test_the_fleets_node_table_shows_one_page_of_a_large_fleet_with_links_to_the_others():
    import whaleflux.console.app  # noqa: F401 - registers the templates' filters
    from whaleflux.console.fleetfold import NodeLine
    from whaleflux.console.pages.fleet import NODES_PER_PAGE, FleetView, fleet_frames

    nodes = [NodeLine(cluster="c", node=f"n-{i:04d}", gpus=8) for i in range(1000)]
    frames = dict(fleet_frames(FleetView(None, nodes, {}, []), page=3))
    table = frames["fleet"]
    shown = re.findall(r'href="/fleet/nodes/(n-\d+)"', table)
    assert shown == [f"n-{i:04d}" for i in range(2 * NODES_PER_PAGE, 3 * NODES_PER_PAGE)]
    assert "201–300 of 1000" in table and 'href="/fleet?nodes=2"' in table and 'href="/fleet?nodes=4"' in table
    small = dict(fleet_frames(FleetView(None, nodes[:4], {}, [])))["fleet"]
    assert "of 4" not in small and "n-0003" in small  # one page: no pager


def _telemetry(node: str, at: datetime, util: float, **extra: object) -> bytes:
    from whaleflux.shared.events import GpuTelemetry, encode, make_envelope

    gpus = [{"uuid": f"GPU-{node}-{i}", "index": i, "model": "H100", "utilization_gpu_pct": util,
             "memory_used_mib": 1024, "memory_total_mib": 81559, "temperature_c": 87 if i else 40,
             "slowdown_temperature_c": 90, **(extra if i == 1 else {})} for i in range(2)]
    data = GpuTelemetry.model_validate({"cluster": "c", "node": node, "seq": 1, "sample_time": at, "gpus": gpus})
    return encode(make_envelope(data, source="test"))


def _state():
    import time as clock

    from whaleflux.console.fleetstate import FleetState
    from whaleflux.console.upstream import Upstream

    # Nothing is read from telemetry here: the details were "just read" (empty).
    state = FleetState(Upstream({"telemetry": "http://127.0.0.1:9"}, ""), details_every_s=3600, stale_after_s=15)
    state.details_at = clock.monotonic()
    return state


def test_the_fleet_state_keeps_each_gpus_newest_sample_from_the_bus_and_flags_it_as_telemetry_does():
    state = _state()
    now = datetime.now(UTC)
    state.on_telemetry(_telemetry("b", now, 70, ecc_uncorrected=1))
    state.on_telemetry(_telemetry("a", now, 10, xid_errors=[79]))
    state.on_telemetry(_telemetry("b", now.replace(year=now.year - 1), 5))  # older: ignored
    state.on_telemetry(b'{"not": "an event"}')
    # From node a's subject, data naming node c: the services dead-letter it, the console shows none of it.
    state.on_telemetry(_telemetry("c", now, 99), "gpu.telemetry.c.a")
    state.on_telemetry(_telemetry("a", now, 10, xid_errors=[79]), "gpu.telemetry.c.a")  # its own: taken
    assert state.ignored == 2

    assert asyncio.run(state.ready()) == []
    rows = state.rows()
    assert [(r.node, r.gpu.index, r.gpu.utilization_gpu_pct) for r in rows] == [
        ("a", 0, 10), ("a", 1, 10), ("b", 0, 70), ("b", 1, 70)]
    assert [r.flags for r in rows] == [[], ["hot", "xid"], [], ["hot", "ecc"]]
    assert [r.gpu.uuid for r in state.rows("b")] == ["GPU-b-0", "GPU-b-1"] and state.rows("nope") == []

    numbers = state.numbers({})
    fleet = numbers.summary
    assert (fleet.gpus, fleet.nodes, fleet.hot, fleet.erroring, fleet.stale) == (4, 2, 2, 2, 0)
    assert [(n.node, n.gpus, n.util_mean_pct, n.flagged_gpus) for n in numbers.nodes] == [
        ("a", 2, 10, 1), ("b", 2, 70, 1)]

    # A GPU silent longer than stale_after_s is stale, and its node too once all its GPUs are.
    state.on_telemetry(_telemetry("old", now.replace(year=now.year - 1), 0))
    rows = state.rows("old")
    assert all("stale" in r.flags and r.stale for r in rows)
    assert [n.stale for n in state.numbers({}).nodes if n.node == "old"] == [True]


def _job_event(data: dict[str, object], kind: str) -> bytes:
    from whaleflux.shared import events
    from whaleflux.shared.events import encode, make_envelope

    return encode(make_envelope(getattr(events, kind).model_validate(data), source="test"))


def test_the_job_holding_a_gpu_shows_from_the_bus_at_once_and_an_older_read_of_telemetry_never_overrides_it():
    from whaleflux.console.models import GpuJob, GpuRow

    state = _state()
    now = datetime.now(UTC)
    state.on_telemetry(_telemetry("a", now, 50))
    # What telemetry answered when the console started: GPU 1 held by a job placed before then.
    read = GpuRow.model_validate({**state.rows("a")[1].model_dump(), "job": {"job_id": "old", "team": "t0"}})
    state._take_details([read])
    assert [r.job.job_id if r.job else None for r in state.rows("a")] == [None, "old"]

    where = {"cluster": "c", "node": "a", "attempt": 1}
    state.on_job(_job_event({"job_id": "j1", "name": "train", "team": "web", "project": "p", "command": ["x"]},
                            "JobSubmitted"))
    state.on_job(_job_event({**where, "job_id": "j1", "gpu_model": "H100", "gpu_uuids": ["GPU-a-0"],
                             "gpu_indices": [0], "command": ["x"], "team": "web", "project": "p"}, "JobPlaced"))
    jobs = [r.job for r in state.rows("a")]
    assert jobs[0] == GpuJob(job_id="j1", name="train", team="web", project="p")  # at once, not at the next read
    assert state.numbers({}).summary.with_job == 2
    ended = {**where, "exit_code": 0, "started_at": now, "finished_at": now}
    state.on_job(_job_event({**ended, "job_id": "old"}, "JobFinished"))  # heard on the bus: released
    state.on_job(_job_event({**ended, "job_id": "j1"}, "JobFinished"))
    assert [r.job for r in state.rows("a")] == [None, None]
    # A read of telemetry made before those events still shows both jobs: it changes nothing.
    stale_read = GpuRow.model_validate({**read.model_dump(), "job": {"job_id": "old"}})
    first = GpuRow.model_validate({**state.rows("a")[0].model_dump(), "job": {"job_id": "j1"}})
    state._take_details([first, stale_read])
    assert [r.job for r in state.rows("a")] == [None, None] and state.numbers({}).summary.with_job == 0


def test_telemetrys_gpu_list_is_read_in_chunks_and_a_bad_answer_is_an_error():
    import pytest
    from pydantic import TypeAdapter

    from whaleflux.console.fleetstate import parse_rows
    from whaleflux.console.models import GpuRow

    state = _state()
    now = datetime.now(UTC)
    for n in range(9):
        state.on_telemetry(_telemetry(f"n{n}", now, 10 * n))
    body = TypeAdapter(list[GpuRow]).dump_json(state.rows())
    assert parse_rows(body, chunk=4) == TypeAdapter(list[GpuRow]).validate_json(body)  # 18 rows, 5 chunks
    for bad in (b"not json", b'{"gpus": 1}', b'[{"node": "x"}]'):
        with pytest.raises(ValueError):
            parse_rows(bad)


def test_the_sizing_table_shows_each_configurations_memory_against_the_serving_budget_not_the_whole_gpu():
    import whaleflux.console.app  # noqa: F401 - registers the templates' filters
    from whaleflux.console.models import SizingReport
    from whaleflux.console.web import fragment
    from whaleflux.shared.sizing import SizingRequest, estimate

    # 22.8 GiB a GPU: inside an RTX 4090's 24 GiB, outside vLLM's 90% of it (21.6 GiB), so it is not offered.
    asked = {"max_gpus": 1}
    served = estimate(SizingRequest(model="llama-3-8b", task="serve", context=4096, batch=9, max_gpus=1))
    report = SizingReport.model_validate(served.model_dump(mode="json"))  # as the console reads /v1/size
    html = fragment("_sizing_options.html", report=report, asked=asked)
    cells = re.findall(r'<td>(\w+)</td><td class="n">1</td>.*?data-testid="fit">([^<]*)<span class="hint">\(([^)]*)\)',
                       html)
    assert cells == [(o.gpu, f"{o.per_gpu_bytes / 2**30:.1f} / {o.budget_bytes / 2**30:.1f} GiB ",
                      f"90% of {o.capacity_bytes / 2**30:.1f} GiB") for o in served.options if o.best_split]
    assert {gpu for gpu, _, _ in cells} == {"A100", "H100", "H200"} and "RTX4090" not in html
    assert ("H100", "22.8 / 71.7 GiB ", "90% of 79.6 GiB") in cells
    # Training is judged against the whole GPU: no budget shown.
    trained = estimate(SizingRequest(model="llama-3-8b", task="lora", context=4096, max_gpus=1))
    html = fragment("_sizing_options.html", report=SizingReport.model_validate(trained.model_dump(mode="json")),
                    asked=asked)
    assert 'data-testid="fit">' in html and "% of" not in html


def test_static_files_are_linked_by_their_content_and_kept_by_the_browser_until_that_changes(monkeypatch):
    from fastapi.testclient import TestClient

    from whaleflux.console.app import create_app
    from whaleflux.console.settings import ConsoleSettings

    monkeypatch.setenv("WHALEFLUX_ENVIRONMENT", "development")
    monkeypatch.setenv("WHALEFLUX_ADMIN_TOKEN", "console-test-admin-token-0123")
    client = TestClient(create_app(ConsoleSettings()))  # no lifespan: the bus is not needed for these
    html = client.get("/login").text
    links = dict(re.findall(r'(?:src|href)="/static/([^"?]+)\?v=([0-9a-f]+)"', html))
    assert {"vendor/htmx-2.0.11.min.js", "vendor/htmx-ext-sse-2.2.4.js"} <= set(links)
    static = ROOT / "services" / "console" / "static"
    assert f"<style>{(static / 'console.css').read_text()}</style>" in html  # in the page: no round trip for it
    for name, version in links.items():
        got = client.get(f"/static/{name}?v={version}")
        assert got.status_code == 200 and got.content == (static / name).read_bytes()
        assert "immutable" in got.headers["cache-control"]
        assert got.headers["content-type"].startswith(("text/css", "text/javascript", "application/javascript"))
        again = client.get(f"/static/{name}?v={version}", headers={"If-None-Match": got.headers["etag"]})
        assert again.status_code == 304 and not again.content
    # Another version (an old page's link) or none: served, but to be asked again next time.
    css = (static / "console.css").read_bytes()
    for url in ("/static/console.css", "/static/console.css?v=0123456789abcdef"):
        got = client.get(url)
        assert got.content == css and got.headers["cache-control"] == "no-cache"
    for missing in ("/static/nothing.js", "/static/../settings.py", "/static/vendor"):
        assert client.get(missing).status_code == 404


def test_empty_pages_say_what_to_do_next_and_a_service_that_did_not_answer_is_not_called_empty():
    import whaleflux.console.app  # noqa: F401 - registers the templates' filters
    from whaleflux.console.models import FleetSummary
    from whaleflux.console.pages.fleet import FleetView, fleet_frames
    from whaleflux.console.web import fragment

    nothing = FleetSummary(gpus=0, nodes=0, power_w=0, stale=0, hot=0, throttled=0, erroring=0)
    fleet = dict(fleet_frames(FleetView(nothing, [], {}, [])))["fleet"]
    assert "No GPUs yet — start an agent" in fleet and "whaleflux agent --simulate" in fleet
    down = dict(fleet_frames(FleetView(None, [], {}, [], errors=["telemetry: did not answer"])))["fleet"]
    assert "No GPUs yet" not in down and "telemetry: did not answer" in down
    jobs = fragment("_jobs_table.html", jobs=[], error=None)
    assert 'href="/jobs/new">submit one</a>' in jobs and "whaleflux submit" in jobs
    assert "No jobs here yet" not in fragment("_jobs_table.html", jobs=[], error="scheduler: did not answer")
