"""Input no service may be broken by: hostile YAML, oversized and malformed bodies (issue 18, 4).

The YAML reader is tested on its own and through the upload endpoints of real services; the body guard
through a service's app before it has connected (it answers before any route, so no servers are needed).
"""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from whaleflux.scheduler.app import SchedulerSettings, build
from whaleflux.shared import yamlconfig
from whaleflux.shared.runtime_http import MAX_BODY_BYTES, guard_input

from .fuzzing import TOKEN
from .test_fuzz import running


def _laughs(levels: int) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines)


HOSTILE = {
    "self-referencing alias": ("a: &a [*a]\n", "nested deeper than 64 levels (a recursive alias?)"),
    "self-merging alias": ("a: &a {<<: *a}\n", "nested deeper than 64 levels (a recursive alias?)"),
    "10,000 nested [": ("[" * 10_000, "nested deeper than 64 levels"),
    "billion laughs": (_laughs(9), "expands to more than 200000 values (aliases)"),
    "NUL byte": ("a: \x00\n", "unacceptable character #x0000"),
    "text that was not UTF-8": ("a: \ufffd\n", "(file): not UTF-8 text"),
    "a key that is a list": ("? [a, b]\n: 1\n", "a key is not a plain value"),
    "a date that does not exist": ("a: 2026-13-45\n", "a value that cannot be read: month must be in 1..12"),
    "python tag": ("!!python/object/apply:os.system ['id']\n", "could not determine a constructor"),
    "too large": ("a: " + "x" * yamlconfig.MAX_BYTES, f"larger than {yamlconfig.MAX_BYTES} bytes"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_yaml_is_refused_with_the_reason_naming_the_file(name):
    text, reason = HOSTILE[name]
    with pytest.raises(yamlconfig.ConfigFileError) as err:
        yamlconfig.parse(text, "up.yaml")
    [line] = err.value.errors
    assert line.startswith("up.yaml:") and reason in line, line


@pytest.mark.parametrize("body, reason", [
    (b"\xff\xfe\x00\x00" + "a: 1".encode("utf-32-le"), "UTF-32 text (byte order mark); send UTF-8"),
    (b"\xfe\xff" + "a: 1".encode("utf-16-be"), "UTF-16 text (byte order mark); send UTF-8"),
    (b"a: \xff\n", "not UTF-8 text (byte 3)"),
])
def test_uploads_in_another_encoding_are_refused(body, reason):
    with pytest.raises(yamlconfig.ConfigFileError) as err:
        yamlconfig.decode_text(body, "up.yaml")
    assert err.value.errors == [f"up.yaml:1: (file): {reason}"]


def test_a_utf8_bom_and_anchors_within_the_limits_are_fine():
    located = yamlconfig.parse("\ufeffbase: &b {gpus: 8}\nnodes: [*b, *b]\n", "ok.yaml")
    assert located.doc == {"base": {"gpus": 8}, "nodes": [{"gpus": 8}, {"gpus": 8}]}
    assert located.line_of(("nodes",)) == 2


@pytest.mark.parametrize("service, path", [("inventory", "/admin/assets"), ("billing", "/admin/pricebook")])
async def test_every_hostile_document_uploaded_gets_a_422_listing_the_problem(env, service, path):
    uploads = [text.encode("utf-8", "surrogatepass") for text, _ in HOSTILE.values()]
    uploads += [b"\xff\xfe\x00\x00" + "a: 1".encode("utf-32-le"), b"\xff\xfe" + "a: 1".encode("utf-16-le")]
    async with running(service) as (client, _):
        for body in uploads:
            r = await client.put(path, content=body, headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 422, (body[:40], r.status_code, r.text[:300])
            [problem] = r.json()["detail"]["errors"]
            assert problem.startswith("upload:1: (")
        r = await client.put(path, content=uploads[-1], headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.json()["detail"]["errors"] == ["upload:1: (file): UTF-16 text (byte order mark); send UTF-8"]


def _scheduler() -> httpx.AsyncClient:
    app, _ = build(SchedulerSettings(admin_token=TOKEN))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://scheduler")


JOB = b'{"name": "x", "command": ["true"], "gpus": %s}'


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
async def test_json_bodies_with_nan_or_infinity_are_refused_before_any_route(number):
    async with _scheduler() as client:
        r = await client.post("/v1/jobs", content=JOB % number, headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["detail"] == f"body.gpus: {number.decode()} is not a finite number (JSON has no NaN or Infinity)"


async def test_the_422_for_a_nan_names_where_it_is():
    async with _scheduler() as client:
        r = await client.post("/v1/size", content=b'{"a": [1, {"b": [2.5, Infinity]}], "c": NaN}',
                              headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 422 and r.json()["detail"].startswith("body.a.1.b.1: Infinity is not a finite number")


async def test_bodies_over_the_limit_are_refused_by_length_or_as_they_stream():
    big = b" " * (MAX_BODY_BYTES + 1)

    async def chunks():
        for i in range(0, len(big), 1 << 20):
            yield big[i:i + (1 << 20)]

    async with _scheduler() as client:
        declared = await client.post("/v1/jobs", content=big, headers={"Content-Type": "application/json"})
        streamed = await client.post("/v1/jobs", content=chunks(), headers={"Content-Type": "application/json"})
        bad_length = await client.post("/v1/jobs", content=b"{}", headers={"Content-Length": "12x"})
    assert declared.status_code == 413 and streamed.status_code == 413
    assert declared.json()["detail"] == f"request body: larger than {MAX_BODY_BYTES} bytes"
    assert bad_length.status_code == 400


async def test_malformed_bodies_get_4xx_naming_the_problem_never_500():
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with _scheduler() as client:
        not_utf8 = await client.post("/v1/jobs", content=b'\xff\xfe{"name": 1}', headers=headers)
        deep = await client.post("/v1/jobs", content=b"[" * 100_000 + b"]" * 100_000, headers=headers)
    assert not_utf8.status_code == 400 and not_utf8.json()["detail"] == "body: JSON must be UTF-8 (byte 0 is not)"
    assert deep.status_code == 400 and deep.json()["detail"] == "body: JSON nested too deeply"


class Body(BaseModel):
    name: str


async def test_a_422_shows_bytes_that_are_not_utf8_instead_of_failing_with_500():
    """FastAPI's own 422 handler fails to render a body of raw bytes (UnicodeDecodeError: a 500)."""
    app = FastAPI()
    guard_input(app)

    @app.post("/x")
    async def x(body: Body) -> dict[str, str]:
        return {"name": body.name}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        r = await client.post("/x", content=b"\xff\xfe\x00", headers={"Content-Type": "text/plain"})
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == ["body"] and error["input"] == "\ufffd\ufffd\x00"


async def test_the_agents_fault_endpoint_answers_a_body_that_is_not_utf8_with_4xx():
    from whaleflux.agent.app import AgentSettings
    from whaleflux.agent.app import create_app as agent_app

    app = agent_app([], AgentSettings(admin_token=TOKEN, nats_password="p"))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as client:
        as_text = await client.post("/admin/faults", content=b"\xff\xfe\x00", headers={**auth,
                                                                                       "Content-Type": "text/plain"})
        as_json = await client.post("/admin/faults", content=b"\xff\xfe\x00", headers={
            **auth, "Content-Type": "application/json"})
    assert as_text.status_code == 422 and as_text.json()["detail"][0]["loc"] == ["body"]
    assert as_json.status_code == 400 and as_json.json()["detail"].startswith("body: JSON must be UTF-8")


async def test_regular_expressions_re_cannot_compile_are_a_400_not_a_500(env):
    deep, huge = "(" * 1000 + ")" * 1000, "a{4294967296}"
    async with running("alerting") as (client, _):
        answers = [await client.get("/api/v2/alerts", params={"receiver": deep}),
                   await client.get("/api/v2/alerts/groups", params={"receiver": huge}),
                   await client.get("/api/v2/alerts", params={"filter": f'alertname=~"{deep}"'}),
                   await client.get("/api/v2/silences", params={"filter": f'alertname=~"{huge}"'})]
    assert [r.status_code for r in answers] == [400, 400, 400, 400], [r.text[:200] for r in answers]
    assert answers[0].json()["detail"].startswith("receiver: bad regex")
    assert answers[2].json()["detail"].startswith("filter: matcher")
