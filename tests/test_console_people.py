"""Each person logs in to the console with their own token and acts as themselves (issue 18): the console calls the
services with that person's credential, so the scheduler applies their role (a viewer cannot cancel from the
console) and its audit log names them, not `admin`. Real processes: scheduler and console on real NATS and Redis.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from .processes import make_cluster, wait_until

CSRF = re.compile(r'name="csrf" value="([^"]+)"')




@pytest.fixture
def stack(clean_servers, tmp_path, people):
    cluster = make_cluster(clean_servers, tmp_path)
    audit = tmp_path / "scheduler-audit.jsonl"
    scheduler = cluster.service("scheduler", WHALEFLUX_TOKENS_FILE=people["path"], WHALEFLUX_AUDIT_LOG=str(audit))
    console = cluster.service("console", WHALEFLUX_TOKENS_FILE=people["path"], WHALEFLUX_SCHEDULER_URL=scheduler.url,
                              WHALEFLUX_AUDIT_LOG=str(tmp_path / "console-audit.jsonl"))
    try:
        for proc in (scheduler, console):
            proc.wait_ready(120)
        yield console.url, audit, tmp_path / "console-audit.jsonl"
    finally:
        cluster.stop()


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found is not None, "no CSRF token on the page"
    return found[1]


def log_in(url: str, token: str) -> tuple[httpx.Client, httpx.Response]:
    """A browser-like client that filled in the login form with `token`; the answer to the form."""
    client = httpx.Client(base_url=url, timeout=30)
    form = client.get("/login", params={"next": "/jobs"})
    answer = client.post("/login", data={"token": token, "csrf": csrf_of(form.text), "next": "/jobs"})
    return client, answer


def audit_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_each_person_acts_in_the_console_with_their_own_role_and_the_audit_log_names_them(stack, people):
    url, audit, console_audit = stack
    stranger, refused = log_in(url, "not-anyones-token")
    assert refused.status_code == 401 and "Wrong token" in refused.text
    _, scoped = log_in(url, people["scheduler"])  # a component's token, accepted only by inventory
    assert scoped.status_code == 401

    sam, answer = log_in(url, people["submitter"])
    assert answer.status_code == 303 and answer.headers["location"] == "/jobs"
    assert people["submitter"] not in answer.headers["set-cookie"]  # the credential stays on the server
    jobs = sam.get("/jobs")
    assert jobs.status_code == 200 and "sam (submitter)" in jobs.text
    csrf = csrf_of(jobs.text)
    submitted = sam.post("/jobs", data={"csrf": csrf, "command": "sleep 600", "name": "mine", "team": "vision"})
    assert submitted.status_code == 303, submitted.text
    job_id = submitted.headers["location"].rsplit("/", 1)[1]
    other_team = sam.post("/jobs", data={"csrf": csrf, "command": "sleep 1", "team": "speech"})
    assert other_team.status_code == 422 and "speech" in other_team.text  # the scheduler's 403, on the form

    vic, _ = log_in(url, people["viewer"])
    page = vic.get(f"/jobs/{job_id}")
    assert page.status_code == 200 and "vic (viewer)" in page.text
    cancel = vic.post(f"/jobs/{job_id}/cancel", headers={"X-CSRF-Token": csrf_of(page.text)})
    assert cancel.status_code == 200 and "scheduler refused: 403" in cancel.text

    def entries() -> list[tuple[str | None, str, str, str]]:
        return [(e["who"]["name"] if e["who"] else None, e["method"], e["path"], e["result"])
                for e in audit_lines(audit) if e["path"].startswith("/v1/jobs")]

    wanted = [("sam", "POST", "/v1/jobs", "ok"), ("sam", "POST", "/v1/jobs", "refused"),
              ("vic", "POST", f"/v1/jobs/{job_id}/cancel", "refused")]
    wait_until(lambda: entries() == wanted, timeout=30, what=f"the scheduler's audit lines {wanted}")
    assert not any(e["who"] and e["who"]["name"] in ("admin", "admin-token") for e in audit_lines(audit))
    logins = [(e["who"]["name"] if e["who"] else None, e["status"]) for e in audit_lines(console_audit)]
    assert logins == [(None, 401), (None, 401), ("sam", 303), ("vic", 303)]

    # Logging out ends the session on the server: the same cookie is refused afterwards.
    cookie = sam.cookies["wf_session"]
    assert sam.post("/logout", data={"csrf": csrf}).status_code == 303
    assert httpx.get(url + "/jobs", cookies={"wf_session": cookie}).status_code == 303
    for client in (stranger, sam, vic):
        client.close()


def test_a_viewer_sees_a_jobs_log_in_the_console_with_its_secrets_masked_as_the_api_masks_them(
        clean_servers, tmp_path, people):
    from .processes import ADMIN_TOKEN

    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler", WHALEFLUX_TOKENS_FILE=people["path"])
    console = cluster.service("console", WHALEFLUX_TOKENS_FILE=people["path"], WHALEFLUX_SCHEDULER_URL=scheduler.url)
    cluster.agent("r4090-01")
    try:
        for proc in (scheduler, console):
            proc.wait_ready(120)
        secret = "s3cr3t-value-0987"
        body = {"name": "leaky", "command": ["sh", "-c", 'echo "using $HF_TOKEN"; echo "password=hunter22 done"'],
                "env": {"HF_TOKEN": secret}}
        answer = httpx.post(f"{scheduler.url}/v1/jobs", json=body, timeout=30,
                            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["job_id"]
        wait_until(lambda: httpx.get(f"{scheduler.url}/v1/jobs/{job_id}", timeout=10,
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["state"] == "succeeded",
                   timeout=120, what="the job ran")
        assert secret in (tmp_path / "home" / "jobs" / f"{job_id}.1.log").read_text()  # the log itself is raw
        vic, _ = log_in(console.url, people["viewer"])
        page = wait_until(lambda: (p := vic.get(f"/jobs/{job_id}")).status_code == 200 and "using" in p.text and p,
                          what="the job's log on its page")
        assert "using [redacted]" in page.text and "password=[redacted] done" in page.text
        log = page.text.split('data-testid="job-log">', 1)[1].split("</pre>", 1)[0]
        assert secret not in page.text and "hunter22" not in log  # the command is shown as submitted
    finally:
        cluster.stop()
