"""A failed job's alert carries its last log lines (issue 16, deliver 6): the agent's job.finished has a bounded
`log_tail` with secrets masked (real and virtual jobs), and `JobExitedWithError` shows it (annotation
`description`) in every receiver, within their limits. Pure tests first, then a real agent and alerting."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from pydantic import ValidationError

from whaleflux.agent.logtail import tail_lines
from whaleflux.agent.virtual import stated_run
from whaleflux.alerting.config import DEFAULT_RULES_FILE, load_config
from whaleflux.alerting.dispatch.groups import Notification, NotifiedAlert
from whaleflux.alerting.receivers import pagerduty, slack, teams
from whaleflux.alerting.rules.engine import RuleEngine
from whaleflux.shared import subjects
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import JobFinished, JobPlaced, JobSubmitted, NodeRegistered
from whaleflux.shared.redaction import REDACTED

from .processes import connect_bus, make_cluster, until
from .test_agent_virtual_jobs import _last
from .test_alerting_service import Receiver

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CLUSTER, NODE = "onprem", "a100-01"
REPORTED = subjects.job_finished(CLUSTER, NODE)
SECRET = "hf_s3cr3t_token_value"


def test_the_tail_is_what_a_terminal_shows_last_bounded_and_without_secrets():
    log = b"".join(f"step {i} loss 0.{i:03d}\n".encode() for i in range(100))
    log += b"epoch 3:  10%|#   \r\x1b[2Kepoch 3:  40%|####      \r\n\n\tat train.py:12\n"
    log += f"login with HF_TOKEN={SECRET} and Authorization: Bearer abc.def.ghi\n".encode()
    log += b"db password=hunter22 ok\n" + b"x" * 5000 + b"CUDA out of memory\n"
    lines = tail_lines(log, {"HF_TOKEN": SECRET, "EPOCHS": "3", "PASSWORD": "hunter22"})
    assert len(lines) == 20 and lines[0] == "step 85 loss 0.085"
    assert "epoch 3:  40%|####" in lines  # the progress bar as its last carriage return left it
    assert "    at train.py:12" in lines  # tab expanded, blank line skipped
    assert lines[-3] == f"login with HF_TOKEN={REDACTED} and Authorization: Bearer {REDACTED}"
    assert lines[-2] == f"db password={REDACTED} ok"
    assert SECRET not in "".join(lines) and "hunter22" not in "".join(lines) and "abc.def" not in "".join(lines)
    assert len(lines[-1]) == 400 and lines[-1].startswith("…") and lines[-1].endswith("CUDA out of memory")
    # A read that starts mid-file drops its first, cut line; bytes that are not UTF-8 are replaced.
    assert tail_lines(b"ut line\nnext\n\xff done\n", truncated=True) == ["next", "\ufffd done"]


def test_job_finished_bounds_its_log_tail_and_old_events_stay_valid():
    base = dict(job_id="j1", attempt=1, cluster="c", node="n", exit_code=1, started_at=T0, finished_at=T0)
    assert JobFinished(**base).log_tail is None  # an event from an older agent
    assert JobFinished(**base, log_tail=["a"] * 20).log_tail == ["a"] * 20
    with pytest.raises(ValidationError):
        JobFinished(**base, log_tail=["a"] * 21)
    with pytest.raises(ValidationError):
        JobFinished(**base, log_tail=["a" * 401])


def test_a_virtual_job_can_state_its_exit_code():
    assert stated_run(["python", "train.py"], {"WHALEFLUX_VIRTUAL_EXIT": "137"}) == (0.0, 137)
    assert stated_run(["sleep", "3"], {"WHALEFLUX_VIRTUAL_EXIT": "2"}) == (3.0, 2)
    assert stated_run(["false"], {"WHALEFLUX_VIRTUAL_EXIT": "no"}) == (0.0, 1)


def test_the_shipped_rule_describes_the_failure_with_its_last_lines():
    engine = RuleEngine(load_config(DEFAULT_RULES_FILE), gpu_models())
    tail = [f"line {i}" for i in range(19)] + ["torch.OutOfMemoryError: CUDA out of memory."]
    finished = JobFinished(job_id="j1", attempt=1, cluster="c", node="n1", exit_code=1, started_at=T0,
                           finished_at=T0 + timedelta(minutes=1), log_tail=tail)
    [tr] = engine.observe_event("job.finished", finished, T0)
    assert tr.labels["cause"] == "oom"
    assert tr.annotations["description"] == "last 10 log line(s):\n" + "\n".join(tail[-10:])
    assert tr.annotations["log_tail"] == "\n".join(tail[-10:])


def _notification(n_alerts: int, description: str) -> Notification:
    alerts = [NotifiedAlert(status="firing", fingerprint=f"fp{i}", starts_at=T0,
                            labels={"alertname": "JobExitedWithError", "severity": "warning", "team": "search"},
                            annotations={"summary": f"job j{i} attempt 1 on n1 exited with code 1 <@here>",
                                         "description": description})
              for i in range(n_alerts)]
    return Notification(id="g-1", receiver="r", group_key="g", group_labels={"team": "search"}, status="firing",
                        alerts=alerts, created_at=T0)


def test_every_receiver_shows_the_last_lines_within_its_limits():
    lines = "last 10 log line(s):\n" + "\n".join(f"<step {i}> ``` & " + "x" * 180 for i in range(10))
    one = _notification(1, lines)
    body = slack.build(one, external_url="http://wf")
    section = body["blocks"][1]["text"]["text"]
    assert len(section) <= slack.TEXT_MAX and "\n```last 10 log line(s):\n&lt;step 0&gt; ` ` ` &amp; " in section
    assert section.endswith("```") and "<@here>" not in section  # mrkdwn escaped (the header is plain text)
    card = teams.build(one, external_url="http://wf")
    [fact] = card["attachments"][0]["content"]["body"][1]["facts"]
    assert "\n\nlast 10 log line(s):\n<step 0>" in fact["value"] and len(fact["value"]) <= 400 + 2 + 1500
    many = teams.build(_notification(20, lines), external_url="http://wf")
    assert len(json.dumps(many, ensure_ascii=False).encode()) <= teams.MAX_BYTES  # facts left out, counted
    assert "more alert(s) not shown" in json.dumps(many)
    page = pagerduty.build(_notification(20, lines), routing_key="k", external_url="http://wf")
    details = page["payload"]["custom_details"]["details"]
    assert len(details) == 10 and all(v.startswith("last 10 log line(s):") for v in details.values())


async def _register(bus) -> NodeRegistered:
    registered = await until(lambda: _last(bus, "WHALEFLUX_NODES", subjects.node_registered(CLUSTER, NODE)),
                             timeout=60, what="node registered")
    return registered[1]


async def _run_failing(bus, job_id: str, command: list[str], env: dict[str, str]) -> None:
    """job.submitted (alerting learns the team) and job.placed straight to the agent."""
    gpu = (await _register(bus)).gpus[0]
    submitted = JobSubmitted(job_id=job_id, name=job_id, team="search", project="rank", command=command, env=env)
    await bus.publish(subjects.JOB_SUBMITTED, submitted, event_id=f"submitted-{job_id}", correlation_id=job_id)
    placed = JobPlaced(job_id=job_id, attempt=1, cluster=CLUSTER, node=NODE, gpu_model=gpu.model,
                       gpu_uuids=[gpu.uuid], gpu_indices=[gpu.index], command=command, env=env, team="search",
                       project="rank")
    await bus.publish(subjects.job_placed(CLUSTER, NODE), placed, event_id=f"placed-{job_id}-1", correlation_id=job_id)


def _job_alerts(recv: Receiver) -> list[dict]:
    return [a for body in recv.received for a in body.get("alerts", [])
            if a["labels"].get("alertname") == "JobExitedWithError" and a["status"] == "firing"]


async def test_a_real_job_that_fails_pages_its_team_with_its_last_log_lines(clean_servers, tmp_path):
    recv = Receiver()
    cluster = make_cluster(clean_servers, tmp_path)
    bus = await connect_bus(clean_servers)
    try:
        alerting = cluster.service("alerting", WHALEFLUX_ALERTING_WEBHOOK_URLS=recv.url,
                                   WHALEFLUX_ALERTING_TICK_S="0.1")
        cluster.agent(NODE, interval_s=0.5)
        alerting.wait_ready()
        script = ("for i in $(seq 1 30); do echo step $i; done; echo \"token=$HF_TOKEN\"; "
                  "echo 'RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB' >&2; exit 3")
        await _run_failing(bus, "train-oom", ["sh", "-c", script], {"HF_TOKEN": SECRET})

        finished: JobFinished = (await until(lambda: _last(bus, "WHALEFLUX_JOBS", REPORTED),
                                             timeout=60, what="job.finished"))[1]
        assert finished.exit_code == 3 and finished.log_tail is not None and len(finished.log_tail) == 20
        assert finished.log_tail[-2:] == [f"token={REDACTED}",
                                          "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"]
        assert finished.log_tail[0] == "step 13"

        await until(lambda: _job_alerts(recv), timeout=60, what="the job's failure alert posted")
        [alert] = _job_alerts(recv)[:1]
        assert alert["labels"]["team"] == "search" and alert["labels"]["cause"] == "oom"
        assert alert["labels"]["exit_code"] == "3"
        description = alert["annotations"]["description"]
        assert description.startswith("last 10 log line(s):\nstep 23\n")
        assert description.endswith("CUDA out of memory. Tried to allocate 2.00 GiB")
        assert SECRET not in json.dumps(recv.received)
        async with httpx.AsyncClient() as http:
            listed = (await http.get(alerting.url + "/v1/alerts")).json()
        assert [a["annotations"]["description"] for a in listed if a["rule"] == "JobExitedWithError"] == [description]
    finally:
        cluster.stop()
        recv.close()
        await bus.close()


async def test_a_virtual_job_reports_the_log_its_job_states(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    bus = await connect_bus(clean_servers)
    try:
        cluster.agent(NODE, interval_s=0.5, WHALEFLUX_VIRTUAL_JOBS="1")
        env = {"WHALEFLUX_VIRTUAL_EXIT": "1", "API_KEY": SECRET,
               "WHALEFLUX_VIRTUAL_LOG": f"loading\nkey {SECRET}\nSegmentation fault\n"}
        await _run_failing(bus, "virtual-fail", ["python", "train.py"], env)
        finished: JobFinished = (await until(lambda: _last(bus, "WHALEFLUX_JOBS", REPORTED),
                                             timeout=60, what="job.finished"))[1]
        assert finished.exit_code == 1
        assert finished.log_tail == ["loading", f"key {REDACTED}", "Segmentation fault"]
    finally:
        cluster.stop()
        await bus.close()
