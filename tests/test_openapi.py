"""Every service's /openapi.json answers 200 and is a valid OpenAPI 3.1 document (issue 18, 5).

Checked: the document's shape, every `$ref` resolving, every operation with responses and unique ids,
every path parameter declared, and the JSON Schemas of the components valid Draft 2020-12 shapes.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from .test_fuzz import SERVICES, build_service

METHODS = {"get", "put", "post", "delete", "patch", "options", "head", "trace"}


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return ([node["$ref"]] if isinstance(node.get("$ref"), str) else []) + [
            r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def _resolves(spec: dict[str, Any], ref: str) -> bool:
    if not ref.startswith("#/"):
        return False
    node: Any = spec
    for part in ref[2:].split("/"):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def problems(spec: dict[str, Any]) -> list[str]:
    out = []
    if not re.fullmatch(r"3\.1\.\d+", str(spec.get("openapi"))):
        out.append(f"openapi: {spec.get('openapi')!r}")
    if not spec.get("info", {}).get("title") or not spec.get("info", {}).get("version"):
        out.append("info: title and version required")
    out += [f"$ref {r}: does not resolve" for r in _refs(spec) if not _resolves(spec, r)]
    ids: set[str] = set()
    for path, ops in spec.get("paths", {}).items():
        if not path.startswith("/"):
            out.append(f"{path}: must start with /")
        declared = set(re.findall(r"{([^}]+)}", path))
        for method, op in ops.items():
            if method not in METHODS:
                continue
            where = f"{method.upper()} {path}"
            if not op.get("responses"):
                out.append(f"{where}: no responses")
            op_id = op.get("operationId")
            if op_id in ids:
                out.append(f"{where}: operationId {op_id} repeated")
            ids.add(op_id)
            in_path = {p["name"] for p in op.get("parameters", []) if p.get("in") == "path"}
            if in_path != declared:
                out.append(f"{where}: path parameters {sorted(in_path)} != {sorted(declared)}")
            for p in op.get("parameters", []):
                if p.get("in") not in {"query", "header", "path", "cookie"} or "schema" not in p:
                    out.append(f"{where}: parameter {p.get('name')}: needs `in` and `schema`")
    for name, schema in spec.get("components", {}).get("schemas", {}).items():
        if not isinstance(schema, dict) or not ({"type", "$ref", "anyOf", "oneOf", "allOf", "enum", "const"}
                                                & set(schema)):
            out.append(f"components.schemas.{name}: not a schema with a type")
    return out


@pytest.mark.parametrize("name", SERVICES)
async def test_every_service_serves_a_valid_openapi_document(name):
    app, _ = build_service(name)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{name}") as client:
        r = await client.get("/openapi.json")
        docs = await client.get("/docs")
    assert r.status_code == 200, r.text[:500]
    spec = r.json()
    assert problems(spec) == []
    assert len(spec["paths"]) >= 10 and "/healthz" in spec["paths"]
    assert docs.status_code == 200 and "/openapi.json" in docs.text


def test_the_agent_and_the_console_serve_valid_openapi_documents():
    from whaleflux.agent.app import AgentSettings
    from whaleflux.agent.app import create_app as agent_app
    from whaleflux.console.app import create_app as console_app
    from whaleflux.console.settings import ConsoleSettings

    agent = agent_app([], AgentSettings(admin_token="t" * 32, nats_password="p"))
    console = console_app(ConsoleSettings())
    for app in (agent, console):
        spec = app.openapi()
        assert problems(spec) == [], app.title
    assert "/admin/faults" in agent.openapi()["paths"]


def test_the_validator_finds_what_is_wrong():
    bad = {"openapi": "2.0", "info": {}, "paths": {
        "/a/{x}": {"get": {"operationId": "a", "parameters": [], "responses": {}}},
        "b": {"get": {"operationId": "a", "responses": {"200": {"$ref": "#/components/schemas/Missing"}}}}}}
    found = problems(bad)
    assert any(p.startswith("openapi:") for p in found) and "info: title and version required" in found
    assert "$ref #/components/schemas/Missing: does not resolve" in found
    assert "GET /a/{x}: no responses" in found and "GET b: operationId a repeated" in found
    assert "GET /a/{x}: path parameters [] != ['x']" in found
