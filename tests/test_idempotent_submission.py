"""`POST /v1/jobs` with an `Idempotency-Key`, against a real scheduler, nats-server and redis-server: a repeat
gets the first job, a stalled bus that answered 503 leaves one job run once, and a body too large for the bus
gets 413."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid

import httpx
from redis.asyncio import Redis

from whaleflux.shared import subjects

from .lifecycle import AUTH, own_servers
from .processes import connect_bus, fetch_stored, make_cluster, until, wait_until

NODE = "r4090-01"
JOB = {"name": "once", "gpus": 1, "command": ["true"], "env": {"A": "1", "B": "2"}}


def _post(url: str, body: dict, key: str | None = None, timeout: float = 30) -> httpx.Response:
    headers = {**AUTH, **({"Idempotency-Key": key} if key else {})}
    return httpx.post(url + "/v1/jobs", json=body, headers=headers, timeout=timeout)


async def test_a_repeat_with_the_same_key_answers_the_first_job_and_another_body_is_refused(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler")
    try:
        await asyncio.to_thread(scheduler.wait_ready)
        key = uuid.uuid4().hex
        first = await asyncio.to_thread(_post, scheduler.url, JOB, key)
        # The same meaning in another order of fields.
        again = await asyncio.to_thread(_post, scheduler.url, dict(reversed(list(JOB.items()))), key)
        other = await asyncio.to_thread(_post, scheduler.url, {**JOB, "command": ["false"]}, key)
        fresh = await asyncio.to_thread(_post, scheduler.url, JOB)
        bad = await asyncio.to_thread(_post, scheduler.url, JOB, "no spaces please")
        assert first.status_code == 202 and again.status_code == 202, (first.text, again.text)
        assert again.json() == first.json()
        assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
        assert other.status_code == 422 and "Idempotency-Key" in other.json()["detail"], other.text
        assert first.json()["job_id"] in other.json()["detail"]
        assert fresh.status_code == 202 and fresh.json()["job_id"] != first.json()["job_id"]
        assert bad.status_code == 422 and "Idempotency-Key" in bad.json()["detail"]

        redis = Redis.from_url(clean_servers.redis_url, password=clean_servers.redis_password)
        try:
            keys = [k async for k in redis.scan_iter("wf:scheduler:idempotency:*")]
            assert len(keys) == 1
            assert await redis.ttl(keys[0]) > 23 * 3600  # remembered a day
        finally:
            await redis.aclose()
    finally:
        cluster.stop()


async def test_a_body_too_large_for_the_bus_gets_413_not_503(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler")
    try:
        await asyncio.to_thread(scheduler.wait_ready)
        # 2 MB: under the HTTP body limit (8 MB), over nats-server's message limit (1 MB).
        big = {**JOB, "env": {f"BLOB{i}": "x" * 60_000 for i in range(35)}}
        plain = await asyncio.to_thread(_post, scheduler.url, big)
        keyed = await asyncio.to_thread(_post, scheduler.url, big, uuid.uuid4().hex)
        for r in (plain, keyed):
            assert r.status_code == 413, r.text
            assert "limit" in r.json()["detail"]
    finally:
        cluster.stop()


async def test_posts_retried_with_one_key_through_a_nats_stall_make_one_job_run_once(tmp_path):
    own = own_servers(tmp_path)
    cluster = make_cluster(own.servers, tmp_path)
    nats_pid = own._proc("nats-server").pid
    marks = tmp_path / "ran"
    body = {**JOB, "name": "stalled", "command": ["sh", "-c", f"echo ran >> {marks}"]}
    stalled = False
    try:
        scheduler = cluster.service("scheduler")
        cluster.agent(NODE, interval_s=0.5)
        await asyncio.to_thread(scheduler.wait_ready)
        await asyncio.to_thread(wait_until, lambda: httpx.get(scheduler.url + "/v1/nodes", headers=AUTH).json(),
                                60, what="the node registered")
        key = uuid.uuid4().hex
        os.kill(nats_pid, signal.SIGSTOP)  # the connection stays up, JetStream acknowledges nothing
        stalled = True
        answers: list[httpx.Response] = []
        for tries in range(1, 20):
            try:
                answers.append(await asyncio.to_thread(_post, scheduler.url, body, key, 20))
            except httpx.TimeoutException:
                pass
            if answers and answers[-1].status_code == 202:
                break
            assert not answers or answers[-1].status_code == 503, answers[-1].text
            # Three failed tries (the JetStream API's 5 s each, and more): about 20 s stalled.
            if stalled and tries >= 3:
                os.kill(nats_pid, signal.SIGCONT)
                stalled = False
        assert answers and answers[-1].status_code == 202, [a.text for a in answers]
        failed = [a for a in answers if a.status_code != 202]
        assert failed and all(a.status_code == 503 for a in failed), [a.text for a in answers]
        done = answers[-1]
        assert done.headers.get("Idempotent-Replayed") == "true"  # the job the first, unanswered try made
        job_id = done.json()["job_id"]

        async with httpx.AsyncClient(base_url=scheduler.url, headers=AUTH, timeout=30) as http:
            async def succeeded() -> bool:
                r = await http.get(f"/v1/jobs/{job_id}")
                return r.status_code == 200 and r.json()["state"] == "succeeded"

            await until(succeeded, 120, "the job run")
            named = [j for j in (await http.get("/v1/jobs", params={"limit": 1000})).json()
                     if j["spec"]["name"] == "stalled"]
        assert [j["job_id"] for j in named] == [job_id]
        assert marks.read_text().splitlines() == ["ran"]

        # Every try published the same event: the stream holds it once, so no late copy can come.
        bus = await connect_bus(own.servers)
        try:
            sub = await bus.js.pull_subscribe(f"{subjects.JOB_SUBMITTED}.>", stream="WHALEFLUX_JOBS")
            stored = await fetch_stored(sub)
        finally:
            await bus.close()
        assert [m.headers.get("Nats-Msg-Id") for m in stored] == [f"submitted-{job_id}"]
    finally:
        if stalled:
            os.kill(nats_pid, signal.SIGCONT)
        cluster.stop()
        own.local.stop()


async def test_the_cli_retries_through_a_nats_stall_and_its_job_runs_once(tmp_path):
    own = own_servers(tmp_path)
    cluster = make_cluster(own.servers, tmp_path)
    nats_pid = own._proc("nats-server").pid
    marks, out = tmp_path / "ran", tmp_path / "submit.out"
    stalled, cli = False, None
    try:
        scheduler = cluster.service("scheduler")
        cluster.agent(NODE, interval_s=0.5)
        await asyncio.to_thread(scheduler.wait_ready)
        await asyncio.to_thread(wait_until, lambda: httpx.get(scheduler.url + "/v1/nodes", headers=AUTH).json(),
                                60, what="the node registered")
        os.kill(nats_pid, signal.SIGSTOP)
        stalled = True
        argv = [sys.executable, "-m", "whaleflux", "submit", "--name", "cli-stalled", "--", "sh", "-c",
                f"echo ran >> {marks}"]
        with out.open("w") as sink:
            cli = await asyncio.to_thread(subprocess.Popen, argv, env=cluster.cli_env(), stdout=sink,
                                          stderr=subprocess.STDOUT)
        await until(lambda: "retrying" in out.read_text(), 60, "the CLI retrying")
        os.kill(nats_pid, signal.SIGCONT)
        stalled = False
        assert await asyncio.to_thread(cli.wait, 90) == 0, out.read_text()
        job_id = out.read_text().split("submitted job ")[1].split()[0]

        async with httpx.AsyncClient(base_url=scheduler.url, headers=AUTH, timeout=30) as http:
            async def succeeded() -> bool:
                r = await http.get(f"/v1/jobs/{job_id}")
                return r.status_code == 200 and r.json()["state"] == "succeeded"

            await until(succeeded, 120, "the job run")
            named = [j for j in (await http.get("/v1/jobs", params={"limit": 1000})).json()
                     if j["spec"]["name"] == "cli-stalled"]
        assert [j["job_id"] for j in named] == [job_id]
        assert marks.read_text().splitlines() == ["ran"]
    finally:
        if stalled:
            os.kill(nats_pid, signal.SIGCONT)
        if cli is not None and cli.poll() is None:
            cli.kill()
            cli.wait()
        cluster.stop()
        own.local.stop()


async def test_a_repeat_after_the_schedulers_redis_was_wiped_is_still_the_first_job_run_once(tmp_path):
    # The keys live in Redis; a wipe forgets them. The job id a key gives is the same each time, so the repeat
    # publishes the very job.submitted the scheduler rebuilt from its stream: no second job.
    own = own_servers(tmp_path)
    cluster = make_cluster(own.servers, tmp_path)
    marks = tmp_path / "ran"
    body = {**JOB, "name": "wiped", "command": ["sh", "-c", f"echo ran >> {marks}"]}
    try:
        scheduler = cluster.service("scheduler")
        cluster.agent(NODE, interval_s=0.5)
        await asyncio.to_thread(scheduler.wait_ready)
        key = uuid.uuid4().hex
        first = await asyncio.to_thread(_post, scheduler.url, body, key)
        assert first.status_code == 202, first.text
        job_id = first.json()["job_id"]

        async with httpx.AsyncClient(base_url=scheduler.url, headers=AUTH, timeout=30) as http:
            async def succeeded() -> bool:
                r = await http.get(f"/v1/jobs/{job_id}")
                return r.status_code == 200 and r.json()["state"] == "succeeded"

            await until(succeeded, 120, "the job run")
            await asyncio.to_thread(own.flushall)
            again = await asyncio.to_thread(wait_until, lambda: (r := _post(scheduler.url, body, key)).status_code
                                            == 202 and r, 120, what="the scheduler back after the wipe")
            assert again.json()["job_id"] == job_id
            async def named() -> list[dict]:
                listed = await http.get("/v1/jobs", params={"limit": 1000})  # 503 while it rebuilds
                return [j for j in listed.json() if j["spec"]["name"] == "wiped" and j["state"] == "succeeded"
                        ] if listed.status_code == 200 else []

            # Listed again once the scheduler has noticed the wipe and rebuilt its store from the stream.
            found = await until(named, 120, "the job rebuilt")
        assert [j["job_id"] for j in found] == [job_id]
        assert marks.read_text().splitlines() == ["ran"]
    finally:
        cluster.stop()
        own.local.stop()
