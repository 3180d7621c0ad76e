"""Gangs spanning nodes in the running system: real NATS and Redis, scheduler and billing processes, and
one simulated agent process with three 8-GPU H100 nodes. A 16-GPU job runs one process per node with its
rank's environment, is all or nothing, is charged once for its 16 GPUs, and moves as a whole when one of
its nodes goes silent.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import httpx
from redis.asyncio import Redis

from whaleflux.scheduler.leadership import Leadership
from whaleflux.scheduler.placement import ClusterState, Placement, place_on
from whaleflux.scheduler.records import JobRecord
from whaleflux.scheduler.schedule_request import NodeView, job_request, node_state
from whaleflux.scheduler.settings import SchedulerSettings
from whaleflux.scheduler.store import SchedulerStore
from whaleflux.shared.events import (
    GpuIdentity,
    JobFinished,
    JobPlaced,
    JobPreempted,
    JobRequeued,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
)
from whaleflux.shared.outbox import Outbox

from .processes import make_cluster, wait_until
from .test_crash_recovery import _job_history
from .test_failover import AUTH, FAST_FAILOVER

FLEET = """
name: gang-test
groups:
  - {name: h100, gpu_model: H100, nodes: 3, gpus_per_node: 8, interconnect: nvlink,
     cluster: onprem, pool: onprem, ownership: owned, racks: 1}
"""

# Each part writes the environment it was given, counts steps into its rank's checkpoint (resuming
# from it when WHALEFLUX_RESUME=1) and prints when it started and ended, so tests can check that two
# attempts never ran at once on one node. The checkpoint is written to a temporary file and renamed over
# the old one, as a real job saves its checkpoints: a part stopped mid-write (or a reader at that moment)
# never sees a truncated file.
GANG_JOB = """
import json, os, pathlib, signal, sys, time
ck = pathlib.Path(os.environ["WHALEFLUX_CHECKPOINT_DIR"])
rank, attempt = os.environ["WHALEFLUX_NODE_RANK"], os.environ["WHALEFLUX_ATTEMPT"]
names = ("CUDA_VISIBLE_DEVICES", "NODE_RANK", "NNODES", "MASTER_ADDR")
seen = {k: v for k, v in os.environ.items() if k.startswith("WHALEFLUX_") or k in names}
(ck / f"env.{attempt}.{rank}.json").write_text(json.dumps(seen))
f = ck / f"step.{rank}"
step = int(f.read_text()) if os.environ["WHALEFLUX_RESUME"] == "1" and f.exists() else 0
resume = os.environ["WHALEFLUX_RESUME"]
print(f"start={time.time()} attempt={attempt} rank={rank} resume={resume} from={step}", flush=True)
def term(*_):
    print(f"sigterm at {step} end={time.time()}", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
while step < int(sys.argv[1]):
    time.sleep(0.1)
    step += 1
    tmp = f.with_name(f.name + ".tmp")
    tmp.write_text(str(step))
    os.replace(tmp, f)
    if os.environ.get("FAIL_RANK") == rank and step == 5:
        print(f"failing end={time.time()}", flush=True)
        sys.exit(3)
print(f"done at {step} end={time.time()}", flush=True)
"""


async def _record(store: SchedulerStore, job_id: str) -> JobRecord:
    job = await store.job(job_id)
    assert job is not None, job_id
    return job


async def test_store_commits_one_placement_per_node_and_stops_every_part_in_one_transaction(clean_servers):
    redis = Redis.from_url(clean_servers.redis_url, password=clean_servers.redis_password, decode_responses=True)
    leadership = Leadership(redis, "wf:scheduler", "t", 5)
    store = SchedulerStore(redis, "wf:scheduler", Outbox(redis, "wf:scheduler"), "test", leadership, lambda: "e1")
    try:
        await redis.set(store.epoch_key, "e1")
        await leadership.acquire(poll_s=0.1)
        spec = JobSubmitted(job_id="g1", name="x", command=["train"], gpus=16)
        regs = [NodeRegistered(
            cluster="c1", node=n, interconnect="nvlink", agent_version="t",
            gpus=[GpuIdentity(uuid=f"{n}-{i}", index=i, model="H100", name="H100", memory_total_mib=81559)
                  for i in range(8)],
        ) for n in ("n1", "n2", "n3")]
        await redis.hset(store.nodes_key, mapping={f"c1/{r.node}": r.model_dump_json() for r in regs})
        nodes = [node_state(NodeView(r), {}) for r in regs]
        placement = place_on(ClusterState(nodes), job_request("g1", spec), SchedulerSettings(environment="development")
                             .policy_config().profile, 0.0)
        assert isinstance(placement, Placement)
        job = JobRecord(job_id="g1", spec=spec, submitted_at=datetime.now(UTC))
        now = datetime.now(UTC)
        await store.commit_placements([(job, placement, None)], now)

        async def staged() -> list[tuple[str, str]]:
            raw = await redis.hgetall("wf:scheduler:outbox")
            out = [(json.loads(v)["subject"], str(f).split(":", 1)[1]) for f, v in sorted(raw.items())]
            await redis.delete("wf:scheduler:outbox")
            return out

        assert await staged() == [("job.placed.c1.n1", "placed-g1-1"), ("job.placed.c1.n2", "placed-g1-1-r1")]
        assert len(await store.alloc()) == 16 and (await _record(store, "g1")).nodes == ["n1", "n2"]
        # Any node of the gang lost: one requeue, a stop order to every node of the attempt.
        [held] = await store.jobs_on("c1/n2")
        await store.requeue(held, "node_lost", "node lost", now, 2.0)
        assert await staged() == [("job.preempted.c1.n1", "preempted-g1-1"),
                                  ("job.preempted.c1.n2", "preempted-g1-1-r1"), ("job.requeued", "requeued-g1-1")]
        assert await store.alloc() == {} and await store.jobs_on("c1/n1") == []
        # A failed gang: the part still running is told to stop.
        job = await _record(store, "g1")
        await store.commit_placements([(job, placement, None)], now)
        await staged()
        job.state = "failed"
        await store.end(job, job.parts[:1], "gang failed", 2.0, now)
        assert await staged() == [("job.preempted.c1.n1", "stopped-g1-2")] and await store.alloc() == {}
        # Restart on failure: the part that failed is not told to stop, the others are.
        job = await _record(store, "g1")
        await store.commit_placements([(job, placement, None)], now)
        await staged()
        await store.requeue(job, "restart_on_failure", "rank 0 failed", now, 2.0, spare=frozenset({0}))
        assert await staged() == [("job.preempted.c1.n2", "preempted-g1-3-r1"), ("job.requeued", "requeued-g1-3")]
    finally:
        await redis.aclose()


def _start(clean_servers, tmp_path: Path, **scheduler_env: str):
    cluster = make_cluster(clean_servers, tmp_path)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    try:
        scheduler = cluster.service("scheduler", **FAST_FAILOVER, **scheduler_env)
        billing = cluster.service("billing")
        agent = cluster.agent(interval_s=0.3, http=True, fleet=fleet)
        scheduler.wait_ready()
        billing.wait_ready()

        def all_healthy():
            nodes = httpx.get(scheduler.url + "/v1/nodes").json()
            return len(nodes) == 3 and all(n["status"] == "healthy" and n["heartbeat_age_s"] is not None for n in nodes)

        wait_until(all_healthy, what="three nodes registered and heartbeating")
    except BaseException:
        cluster.stop()  # a start-up that fails leaves no process behind
        raise
    script = tmp_path / "gang.py"
    script.write_text(GANG_JOB)
    return cluster, scheduler, billing, agent, script


def _submit(scheduler, script: Path, steps: int, **extra) -> str:
    body = {"name": "train", "command": [sys.executable, str(script), str(steps)], "gpus": 16,
            "workload_class": "llm-train", **extra}
    resp = httpx.post(scheduler.url + "/v1/jobs", json=body, headers=AUTH)
    assert resp.status_code == 202, resp.text
    return resp.json()["job_id"]


def _job(scheduler, job_id: str) -> dict:
    return httpx.get(f"{scheduler.url}/v1/jobs/{job_id}").json()


def _ckpt(tmp_path: Path, job_id: str) -> Path:
    return tmp_path / "home" / "areas" / job_id / "checkpoints"


def _steps(tmp_path: Path, job_id: str, rank: int) -> int:
    path = _ckpt(tmp_path, job_id) / f"step.{rank}"
    return int(path.read_text() or 0) if path.exists() else 0


def _log(tmp_path: Path, job_id: str, attempt: int, rank: int) -> str:
    name = f"{job_id}.{attempt}.log" if rank == 0 else f"{job_id}.{attempt}.rank{rank}.log"
    path = tmp_path / "home" / "jobs" / name
    return path.read_text() if path.exists() else ""


def _times(log: str) -> tuple[float, float]:
    return float(log.split("start=")[1].split()[0]), float(log.split("end=")[1].split()[0])


def test_sixteen_gpu_job_runs_one_part_per_node_finishes_once_and_is_charged_for_sixteen_gpus(clean_servers, tmp_path):
    cluster, scheduler, billing, agent, script = _start(clean_servers, tmp_path)
    try:
        # On one NVLink node it can never run: refused at submission, with the reason.
        refused = httpx.post(scheduler.url + "/v1/jobs", headers=AUTH,
                             json={"name": "x", "command": ["true"], "gpus": 16, "nvlink": True})
        assert refused.status_code == 422
        assert "on one NVLink node" in refused.text and "only 8 GPUs per node" in refused.text

        job_id = _submit(scheduler, script, steps=15)
        done = wait_until(lambda: (j := _job(scheduler, job_id))["state"] in ("succeeded", "failed") and j, timeout=120,
                          what="gang finished")
        assert done["state"] == "succeeded" and done["attempt"] == 1 and done["exit_code"] == 0, done
        parts = done["parts"]
        assert [p["rank"] for p in parts] == [0, 1]
        assert all(p["state"] == "exited" and p["exit_code"] == 0 for p in parts)
        nodes = [p["node"] for p in parts]
        assert len(set(nodes)) == 2 and done["node"] == nodes[0] and len(done["gpu_uuids"]) == 16

        # Each part ran with its own node's GPUs, its rank, and the coordinator (rank 0's node).
        for p in parts:
            env = json.loads((_ckpt(tmp_path, job_id) / f"env.1.{p['rank']}.json").read_text())
            assert env["CUDA_VISIBLE_DEVICES"].split(",") == p["gpu_uuids"] and len(p["gpu_uuids"]) == 8
            assert env["WHALEFLUX_JOB_ID"] == job_id and env["WHALEFLUX_CHECKPOINT_DIR"] == str(_ckpt(tmp_path, job_id))
            coordinates = (env["WHALEFLUX_NODE_RANK"], env["WHALEFLUX_NUM_NODES"], env["WHALEFLUX_COORDINATOR"])
            assert coordinates == (str(p["rank"]), "2", nodes[0])
            assert (env["NODE_RANK"], env["NNODES"], env["MASTER_ADDR"]) == (str(p["rank"]), "2", nodes[0])
            assert env["WHALEFLUX_GANG_GPUS"] == "16"
            assert "done at 15" in _log(tmp_path, job_id, 1, p["rank"])

        # Billing: one attempt, 16 GPUs, each node's 8 GPUs for the time its part ran; charged once.
        [usage] = wait_until(lambda: (r := httpx.get(f"{billing.url}/v1/costs/jobs/{job_id}")).status_code == 200
                             and r.json()[0]["state"] == "finished" and r.json(), what="billing record")
        assert usage["gpus"] == 16 and usage["attempt"] == 1 and usage["nodes"] == nodes
        ran = [datetime.fromisoformat(p["finished_at"]) - datetime.fromisoformat(p["started_at"]) for p in parts]
        expected = sum(Decimal(8) * Decimal(str(t.total_seconds())) for t in ran)
        assert abs(Decimal(usage["gpu_seconds"]) - expected) <= Decimal("0.01"), (usage, expected)
        assert float(usage["gpu_seconds"]) >= 16 * 1.4  # each part slept 15 x 0.1 s (less clock granularity)

        # The CLI shows every node; logs are rank 0's unless another node is asked for.
        shown = cluster.cli("jobs", "show", job_id)
        assert shown.returncode == 0 and "rank 1" in shown.stdout and nodes[1] in shown.stdout
        rank0 = cluster.cli("jobs", "logs", job_id)
        assert rank0.returncode == 0 and "rank=0" in rank0.stdout
        rank1 = cluster.cli("jobs", "logs", job_id, "--node", nodes[1])
        assert rank1.returncode == 0 and "rank=1" in rank1.stdout

        history = [e for e in asyncio.run(_job_history(clean_servers)) if getattr(e, "job_id", None) == job_id]
        kinds = Counter((type(e).__name__, e.rank) for e in history
                        if isinstance(e, (JobPlaced, JobStarted, JobFinished)))
        assert kinds == {(k, r): 1 for k in ("JobPlaced", "JobStarted", "JobFinished") for r in (0, 1)}
        assert not [e for e in history if isinstance(e, (JobRequeued, JobPreempted))]
    finally:
        cluster.stop()


def test_a_silent_node_moves_the_whole_gang_once_and_the_surviving_part_stops_first(clean_servers, tmp_path):
    cluster, scheduler, billing, agent, script = _start(clean_servers, tmp_path)
    try:
        job_id = _submit(scheduler, script, steps=50)
        first = wait_until(lambda: (j := _job(scheduler, job_id))["state"] == "running" and j, what="gang running")
        wait_until(lambda: min(_steps(tmp_path, job_id, 0), _steps(tmp_path, job_id, 1)) >= 5,
                   what="both parts checkpointed")
        survivor, silent = [p["node"] for p in first["parts"]]
        [spare] = {"h100-01", "h100-02", "h100-03"} - {survivor, silent}

        resp = httpx.post(agent.url + "/admin/faults", json={"kind": "node-silent", "node": silent}, headers=AUTH)
        assert resp.status_code == 200, resp.text
        moved = wait_until(lambda: (j := _job(scheduler, job_id))["attempt"] == 2 and j["state"] == "running" and j,
                           timeout=60, what="gang resumed as attempt 2")
        assert {p["node"] for p in moved["parts"]} == {survivor, spare}

        done = wait_until(lambda: (j := _job(scheduler, job_id))["state"] in ("succeeded", "failed") and j, timeout=120,
                          what="gang finished")
        assert done["state"] == "succeeded" and done["attempt"] == 2, done
        # Both parts of attempt 1 were stopped (the silent node's agent still takes stop orders);
        # both parts of attempt 2 resumed from their checkpoints.
        for rank in (0, 1):
            assert "sigterm at" in _log(tmp_path, job_id, 1, rank)
            log2 = _log(tmp_path, job_id, 2, rank)
            assert "resume=1" in log2 and int(log2.split("from=")[1].split()[0]) >= 5 and "done at 50" in log2
        # Never two attempts at once on the node that kept its part: attempt 2 started there after attempt 1 ended.
        rank_on = {(a, p["node"]): p["rank"] for a, j in ((1, first), (2, moved)) for p in j["parts"]}
        _, old_end = _times(_log(tmp_path, job_id, 1, rank_on[(1, survivor)]))
        new_start, _ = _times(_log(tmp_path, job_id, 2, rank_on[(2, survivor)]))
        assert new_start >= old_end

        history = [e for e in asyncio.run(_job_history(clean_servers)) if getattr(e, "job_id", None) == job_id]
        [requeued] = [e for e in history if isinstance(e, JobRequeued)]
        assert requeued.cause == "node_lost" and requeued.attempt == 1 and requeued.gang_nodes == [survivor, silent]
        stops = Counter((e.node, e.attempt) for e in history if isinstance(e, JobPreempted))
        assert stops[(survivor, 1)] >= 1 and stops[(silent, 1)] >= 1 and not any(a == 2 for _, a in stops)
        placed = sorted((e.attempt, e.rank, e.node) for e in history if isinstance(e, JobPlaced))
        assert [(a, r) for a, r, _ in placed] == [(1, 0), (1, 1), (2, 0), (2, 1)]

        # Billing: one line per attempt, each for all 16 GPUs; attempt 1 ends when its parts stopped.
        def settled():
            recs = httpx.get(f"{billing.url}/v1/costs/jobs/{job_id}").json()
            return len(recs) == 2 and all(r["ended_at"] for r in recs) and recs

        recs = wait_until(settled, what="both attempts metered and ended")
        assert [(r["attempt"], r["gpus"]) for r in recs] == [(1, 16), (2, 16)]
        for r in recs:
            held = (datetime.fromisoformat(r["ended_at"]) - datetime.fromisoformat(r["started_at"])).total_seconds()
            assert 0 < float(r["gpu_seconds"]) <= 16 * held + 0.01
    finally:
        cluster.stop()


def test_a_failed_part_fails_the_gang_and_the_other_part_is_stopped(clean_servers, tmp_path):
    cluster, scheduler, billing, agent, script = _start(clean_servers, tmp_path)
    try:
        job_id = _submit(scheduler, script, steps=100, env={"FAIL_RANK": "1"})
        done = wait_until(lambda: (j := _job(scheduler, job_id))["state"] in ("succeeded", "failed") and j, timeout=120,
                          what="gang ended")
        assert done["state"] == "failed" and done["exit_code"] == 3 and "rank 1" in done["reason"], done
        rank0 = done["parts"][0]["node"]
        wait_until(lambda: "sigterm at" in _log(tmp_path, job_id, 1, 0), timeout=30, what="rank 0 stopped")
        assert "failing" in _log(tmp_path, job_id, 1, 1)
        # Its GPUs are free again, on both nodes.
        free = wait_until(lambda: sum(n["free"] for n in httpx.get(scheduler.url + "/v1/nodes").json()) == 24 and True,
                          what="all GPUs free")
        assert free
        history = [e for e in asyncio.run(_job_history(clean_servers)) if getattr(e, "job_id", None) == job_id]
        assert [(e.node, e.attempt) for e in history if isinstance(e, JobPreempted)] == [(rank0, 1)]
        assert not [e for e in history if isinstance(e, JobRequeued)]
    finally:
        cluster.stop()


def test_a_high_priority_gang_preempts_jobs_on_two_nodes_which_resume_from_their_checkpoints(clean_servers, tmp_path):
    cluster, scheduler, billing, agent, script = _start(clean_servers, tmp_path,
                                                        WHALEFLUX_MIN_RUN_BEFORE_PREEMPTION_S="0")
    try:
        # One low-priority preemptible job on each node, each long enough to be running when the gang arrives.
        low = [_submit(scheduler, script, steps=400, gpus=8, priority="low", preemptible=True) for _ in range(3)]
        wait_until(lambda: all(_job(scheduler, j)["state"] == "running" for j in low), timeout=60,
                   what="three low-priority jobs running")
        wait_until(lambda: all(_steps(tmp_path, j, 0) >= 3 for j in low), timeout=60, what="low jobs checkpointed")
        gang = _submit(scheduler, script, steps=5, priority="high")
        done = wait_until(lambda: (j := _job(scheduler, gang))["state"] in ("succeeded", "failed") and j, timeout=120,
                          what="gang finished")
        assert done["state"] == "succeeded" and done["attempt"] == 1, done
        history = asyncio.run(_job_history(clean_servers))
        stopped = sorted(e.job_id for e in history if isinstance(e, JobPreempted))
        # Two whole jobs stopped (the fewest GPUs that make room: two nodes), on the nodes the gang then ran on.
        assert len(stopped) == 2 and set(stopped) <= set(low), stopped
        requeued = [e for e in history if isinstance(e, JobRequeued)]
        assert sorted(e.job_id for e in requeued) == stopped
        assert all(e.cause == "preempted" and f"preempted for high job {gang}" in e.reason for e in requeued)
        for job_id in stopped:
            resumed = wait_until(lambda job_id=job_id: (j := _job(scheduler, job_id))["attempt"] == 2
                                 and _log(tmp_path, job_id, 2, 0) and j, timeout=90, what=f"{job_id} resumed")
            assert resumed["state"] in ("placed", "running", "succeeded"), resumed
            log = _log(tmp_path, job_id, 2, 0)
            assert "resume=1" in log and int(log.split("from=")[1].split()[0]) >= 3, log
        untouched = set(low) - set(stopped)
        assert all(_job(scheduler, j)["attempt"] == 1 for j in untouched)
    finally:
        cluster.stop()
