"""The console's job pages survive every job record the scheduler's contract allows.

Generated records in every state (pending, requeued after a preemption, a lost or a drained node, a gang with
some parts placed and some running, rejected, cancelled while pending, ended) are served by a small real HTTP
server standing in for the scheduler, as its API writes them (the shared `JobRecord` model, `why` from the
scheduler's own function), and the console app itself reads and renders them through its real templates: the
jobs list (with and without a state filter) and the job page, with the fragments they use.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markupsafe import escape
from pydantic import TypeAdapter

from whaleflux.scheduler.why import why
from whaleflux.shared.contracts.jobs import ENDED, JOB_STATES, JobPart, JobRecord, JobWhy
from whaleflux.shared.job_events import JobSubmitted

ADMIN = "console-job-states-admin-0123456789"
RECORDS = TypeAdapter(list[JobRecord])
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class Scheduler:
    """What the stand-in scheduler answers now: its jobs, as its API serializes them."""

    def __init__(self) -> None:
        self.jobs: list[JobRecord] = []
        self.raw: dict[str, Any] = {}  # bodies answered as they are, whatever the contract says

    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        if path in self.raw:
            return 200, self.raw[path]
        if path == "/v1/jobs":
            state = query.get("state", [None])[0]
            return 200, [j for j in self.jobs if state is None or j.state == state]
        found = {j.job_id: j for j in self.jobs}
        if m := re.fullmatch(r"/v1/jobs/([^/]+)/why", path):
            job = found.get(m[1])
            if job is not None:
                return 200, JobWhy(job_id=job.job_id, state=job.state, attempt=job.attempt, why=why(job))
        elif m := re.fullmatch(r"/v1/jobs/([^/]+)", path):
            if m[1] in found:
                return 200, found[m[1]]
        elif path.startswith("/v1/costs/jobs/"):
            return 404, {"detail": "no charge recorded for this job"}
        return 404, {"detail": f"{path} not found"}


def _serve(scheduler: Scheduler) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            url = urlsplit(self.path)
            status, body = scheduler.answer(url.path, parse_qs(url.query))
            data = (RECORDS.dump_json(body) if isinstance(body, list) and body and isinstance(body[0], JobRecord)
                    else body.model_dump_json().encode() if hasattr(body, "model_dump_json")
                    else json.dumps(body).encode())
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def console() -> Iterator[tuple[Any, Scheduler]]:
    from fastapi.testclient import TestClient

    from whaleflux.console.app import create_app
    from whaleflux.console.settings import ConsoleSettings

    scheduler = Scheduler()
    server = _serve(scheduler)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    # The bus is nowhere (port 1): the console keeps trying in the background; its pages need none.
    app = create_app(ConsoleSettings(environment="development", admin_token=ADMIN, scheduler_url=url,
                                     billing_url=url, nats_url="nats://127.0.0.1:1", home="/nonexistent"))
    try:
        with TestClient(app) as client:
            login = client.get("/login")
            csrf = re.search(r'name="csrf" value="([^"]+)"', login.text)
            assert csrf is not None
            done = client.post("/login", data={"token": ADMIN, "csrf": csrf[1], "next": "/jobs"},
                               follow_redirects=False)
            assert done.status_code == 303, done.text
            yield client, scheduler
    finally:
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------------- generated records

ids = st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,20}", fullmatch=True)
names = st.text(st.characters(exclude_categories=("Cs", "Cc"), exclude_characters="/\\"), min_size=1,
                max_size=40).filter(lambda s: s.strip(".") != "")
tokens = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
words = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=60)
times = st.integers(0, 10 * 86400).map(lambda s: T0 + timedelta(seconds=s))
nodes = st.sampled_from(["h100-01", "h100-02", "a100-01", "a100-02", "l4-01", "<b>x</b>&'n"])
models = st.sampled_from(["H100", "A100", "L4", "RTX 4090"])
# How a requeue line reads on each path that writes one (transitions.requeue, history.Fold).
causes = st.sampled_from([
    "preempted for a high-priority job", "node lost: no heartbeat for 30 s", "node drained: maintenance",
    "moved to faster GPUs", "exited 1; restart_on_failure", "GPU fault: XID 79 on GPU 3",
])


@st.composite
def specs(draw: st.DrawFn, job_id: str) -> JobSubmitted:
    return JobSubmitted(
        job_id=job_id, name=draw(names), team=draw(tokens), project=draw(tokens),
        command=draw(st.lists(words, min_size=1, max_size=3)), gpus=draw(st.integers(1, 16)),
        gpu_models=draw(st.lists(models, max_size=2, unique=True)), min_memory_mib=draw(st.integers(0, 81920)),
        priority=draw(st.sampled_from(["high", "normal", "low"])), preemptible=draw(st.booleans()),
        env=draw(st.dictionaries(tokens, st.just("********"), max_size=2)),
        labels=draw(st.dictionaries(tokens, tokens, max_size=2)), submitted_by=draw(st.none() | tokens),
        workload_class=draw(st.sampled_from(["llm-train", "finetune", "inference", "small"])),
    )


@st.composite
def gang(draw: st.DrawFn, state: str) -> list[JobPart]:
    """A gang's parts: while placed or running some parts may have started and others not yet (gang-partial);
    an ended gang's parts may have exited, or not (a part lost with its node)."""
    hosts = draw(st.lists(nodes, min_size=2, max_size=4, unique=True))
    part_states = {"placed": ["placed", "running"], "running": ["placed", "running", "exited"]}.get(
        state, ["placed", "running", "exited"])
    parts = []
    for rank, host in enumerate(hosts):
        ps = draw(st.sampled_from(part_states))
        parts.append(JobPart(
            rank=rank, cluster="default", node=host, gpu_model=draw(models),
            gpu_uuids=[f"GPU-{host}-{i}" for i in range(2)], gpu_indices=[0, 1], state=ps,
            started_at=draw(times) if ps != "placed" else None, finished_at=draw(times) if ps == "exited" else None,
            exit_code=draw(st.integers(-9, 255)) if ps == "exited" else None))
    return parts


@st.composite
def records(draw: st.DrawFn, job_id: str | None = None) -> JobRecord:
    job_id = job_id or draw(ids)
    state = draw(st.sampled_from(JOB_STATES))
    requeued = draw(st.lists(st.tuples(nodes, causes), max_size=3))
    attempt = len(requeued) + (0 if state in ("pending", "rejected") or (state == "cancelled" and draw(st.booleans()))
                               else 1)
    requeues = [f"attempt {i + 1} on {host}: {cause}" for i, (host, cause) in enumerate(requeued)]
    fields: dict[str, Any] = {"job_id": job_id, "spec": draw(specs(job_id)), "state": state, "attempt": attempt,
                              "submitted_at": draw(times), "requeues": requeues,
                              "preemptions": sum("preempted" in c for _, c in requeued),
                              "migrations": sum("moved" in c for _, c in requeued)}
    if requeued and state == "pending":
        host, cause = requeued[-1]
        fields["reason"] = f"requeued: {cause}"
        fields["node"] = draw(st.none() | st.just(host))  # back_to_queue keeps the last node
        fields["lost_attempt"] = attempt if "lost" in cause else None
        fields["held_until"] = draw(st.none() | times) if "preempted" in cause or "drained" in cause else None
    elif state == "pending":
        fields["reason"] = draw(st.none() | words)
    elif state == "rejected":
        fields["reason"] = f"rejected: {draw(words)}"
    elif state == "cancelled":
        fields["reason"] = f"cancelled: {draw(words)}"
        fields["finished_at"] = draw(times)
    if state in ("placed", "running") or (state in ENDED - {"rejected"} and attempt and draw(st.booleans())):
        parts = draw(st.just([]) | gang(state))
        host = parts[0].node if parts else draw(nodes)
        fields.update(cluster="default", node=host, gpu_model=parts[0].gpu_model if parts else draw(models),
                      gpu_uuids=[u for p in parts for u in p.gpu_uuids] or [f"GPU-{host}-0"], parts=parts,
                      placed_at=draw(times), placed_because=draw(st.none() | words),
                      started_at=None if state == "placed" else draw(st.none() | times))
    if state in ("succeeded", "failed"):
        fields.update(finished_at=draw(times), exit_code=draw(st.none() | st.integers(-9, 255)),
                      reason=draw(st.none() | words))
    return JobRecord(**fields)


@st.composite
def fleets(draw: st.DrawFn) -> list[JobRecord]:
    job_ids = draw(st.lists(ids, min_size=1, max_size=6, unique=True))
    return [draw(records(job_id)) for job_id in job_ids]


# --------------------------------------------------------------------------- the property

# A real HTTP server and the console app in a thread each, about 10 s: kept out of the quick `-m unit` run.
@pytest.mark.integration
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=fleets(), data=st.data())
def test_every_job_page_renders_every_state_the_scheduler_can_produce(console, jobs: list[JobRecord],
                                                                       data: st.DataObject):
    client, scheduler = console
    scheduler.jobs = jobs
    listed = client.get("/jobs")
    assert listed.status_code == 200, listed.text
    assert 'class="error"' not in listed.text
    for job in jobs:
        row = re.search(rf'<tr data-job="{re.escape(str(escape(job.job_id)))}">(.*?)</tr>', listed.text, re.S)
        assert row is not None, job.job_id
        assert f'<span class="badge {job.state}">{job.state}</span>' in row[1]
        assert str(escape(job.spec.name)) in row[1]
        if job.requeues:
            assert f"requeued {len(job.requeues)}×" in row[1]
        for host in job.nodes:
            assert str(escape(host)) in row[1]

    state = data.draw(st.sampled_from(JOB_STATES))
    filtered = client.get("/jobs", params={"state": state})
    assert filtered.status_code == 200, filtered.text
    assert filtered.text.count("<tr data-job=") == sum(j.state == state for j in jobs)

    job = data.draw(st.sampled_from(jobs))
    shown = client.get(f"/jobs/{job.job_id}")
    assert shown.status_code == 200, shown.text
    html = shown.text
    assert 'class="error"' not in html
    assert f'data-testid="job-state">{job.state}</span>' in html
    assert str(escape(why(job))) in html  # the scheduler's own words for where it stands
    for line in job.requeues:
        assert f"<li>{escape(line)}</li>" in html
    assert ('data-testid="cancel-job"' in html) is (job.state not in ENDED)
    if job.parts:
        assert 'data-testid="gang-parts"' in html
        for part in job.parts:
            assert f'<a href="/fleet/nodes/{escape(part.node)}">{escape(part.node)}</a>' in html
    if job.lost_attempt:
        assert f"attempt {job.lost_attempt}: its node went silent" in html


@pytest.mark.integration
def test_a_scheduler_answer_the_console_cannot_read_is_named_on_the_page_not_a_bare_500(console):
    client, scheduler = console
    scheduler.jobs = []
    bad = {"job_id": "j1", "state": "pending", "spec": {"job_id": "j1", "name": "n", "command": ["x"]},
           "submitted_at": T0.isoformat(), "requeues": [{"attempt": 1}]}  # an older or newer shape
    scheduler.raw = {"/v1/jobs": [bad], "/v1/jobs/j1": bad}
    try:
        listed, shown = client.get("/jobs"), client.get("/jobs/j1")
    finally:
        scheduler.raw = {}
    assert listed.status_code == 200 and shown.status_code == 200
    for html in (listed.text, shown.text):
        assert "scheduler: answered /v1/jobs" in html and "in a shape the console cannot read" in html
        assert "requeues.0: Input should be a valid string" in html


def test_the_scheduler_serves_and_the_console_reads_jobs_with_the_same_models():
    """One source: a field renamed or retyped in `shared.contracts.jobs` changes both sides at once."""
    from fastapi.routing import APIRoute

    import whaleflux.console.models as console_models
    from whaleflux.scheduler import api

    routes = {r.path: r for r in api.jobs.routes if isinstance(r, APIRoute) and "GET" in (r.methods or ())}
    assert routes["/v1/jobs"].response_model == list[JobRecord]
    assert routes["/v1/jobs/{job_id}"].response_model is JobRecord
    assert routes["/v1/jobs/{job_id}/why"].response_model is JobWhy
    assert not {"JobRecord", "JobSpec", "JobWhy", "Requeue"} & set(vars(console_models)), "a second copy"
