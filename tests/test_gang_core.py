"""Gangs spanning nodes, the pure pieces: request, parts, all-or-nothing progress, job environment, metering."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from whaleflux.agent.runner import gang_environment, job_environment, log_name
from whaleflux.billing.metering import UsageRecord, ended, intervals, ledger_key, merge_parts
from whaleflux.scheduler.gang import on_part_report, parts_of
from whaleflux.scheduler.placement import ClusterState, Placement, place_on
from whaleflux.scheduler.records import JobRecord
from whaleflux.scheduler.schedule_request import NodeView, infeasible_reason, job_request, node_state
from whaleflux.scheduler.settings import SchedulerSettings
from whaleflux.scheduler.transitions import part_event_id
from whaleflux.scheduler.why import why
from whaleflux.shared.events import (
    GpuIdentity,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
)

T0 = datetime(2026, 3, 1, tzinfo=UTC)
PROFILE = SchedulerSettings(environment="development").policy_config().profile


def _reg(node: str, gpus: int = 8, model: str = "H100") -> NodeRegistered:
    ids = [
        GpuIdentity(uuid=f"{node}-{i}", index=i, model=model, name=model, memory_total_mib=81559) for i in range(gpus)
    ]
    return NodeRegistered(cluster="c1", node=node, pool="onprem", interconnect="nvlink", agent_version="t", gpus=ids)


def _spec(**kw) -> JobSubmitted:
    return JobSubmitted(job_id=kw.pop("job_id", "g1"), name="x", command=["train"], **kw)


def _cluster(alloc: dict[str, str] | None = None, nodes=("n1", "n2")) -> ClusterState:
    return ClusterState([node_state(NodeView(_reg(n)), alloc or {}) for n in nodes])


def _gang_record(spec: JobSubmitted | None = None) -> tuple[JobRecord, Placement]:
    spec = spec or _spec(gpus=16)
    decision = place_on(_cluster(), job_request(spec.job_id, spec), PROFILE, 0.0)
    assert isinstance(decision, Placement)
    job = JobRecord(
        job_id=spec.job_id,
        spec=spec,
        submitted_at=T0,
        state="placed",
        attempt=1,
        cluster="c1",
        node=decision.node,
        gpu_uuids=[u for s in decision.shares for u in s.gpu_uuids],
        parts=parts_of(decision),
    )
    return job, decision


def _started(job: JobRecord, rank: int, at: datetime) -> JobStarted:
    p = job.parts[rank]
    return JobStarted(
        job_id=job.job_id,
        attempt=1,
        cluster=p.cluster,
        node=p.node,
        gpu_uuids=p.gpu_uuids,
        pid=10 + rank,
        started_at=at,
        rank=rank,
    )


def _finished(job: JobRecord, rank: int, code: int, at: datetime) -> JobFinished:
    p = job.parts[rank]
    return JobFinished(
        job_id=job.job_id,
        attempt=1,
        cluster=p.cluster,
        node=p.node,
        exit_code=code,
        started_at=T0,
        finished_at=at,
        rank=rank,
    )


def test_a_job_larger_than_any_node_spans_nodes_unless_it_needs_one_nvlink_node():
    regs = [_reg("n1"), _reg("n2")]
    gang = _spec(gpus=16)
    assert job_request("g1", gang).allow_multi_node
    assert infeasible_reason(regs, job_request("g1", gang), PROFILE) is None
    one_node = _spec(gpus=16, nvlink=True)
    reason = infeasible_reason(regs, job_request("g1", one_node), PROFILE)
    assert reason is not None and "needs 16 GPUs on one NVLink node" in reason and "only 8 GPUs per node" in reason
    too_big = infeasible_reason(regs, job_request("g1", _spec(gpus=24)), PROFILE)
    assert too_big is not None and "needs 24 GPUs across nodes" in too_big and "16 GPUs in all" in too_big


def test_a_job_that_fits_one_node_waits_for_one_rather_than_being_split():
    # 4 free on each node: a 6-GPU job could be split 4 + 2, but its command may not be written for that.
    alloc = {f"{n}-{i}": "other" for n in ("n1", "n2") for i in range(4)}
    decision = place_on(_cluster(alloc), job_request("j", _spec(gpus=6)), PROFILE, 0.0)
    assert not isinstance(decision, Placement)
    assert "needs 6 GPUs on one node; largest free block is 4" in decision.reason


def test_gang_parts_are_one_per_node_rank_zero_first_and_event_ids_are_fixed_per_part():
    job, decision = _gang_record()
    assert [(p.rank, p.node, len(p.gpu_uuids)) for p in job.parts] == [(0, "n1", 8), (1, "n2", 8)]
    assert job.nodes == ["n1", "n2"] and job.holds("c1", "n2") and not job.holds("c1", "n3")
    assert (
        part_event_id("placed", "g1", 2, 0) == "placed-g1-2" and part_event_id("placed", "g1", 2, 1) == "placed-g1-2-r1"
    )
    one = place_on(_cluster(), job_request("s", _spec(gpus=2)), PROFILE, 0.0)
    assert isinstance(one, Placement) and parts_of(one) == []


def test_gang_runs_when_every_part_started_and_succeeds_when_every_part_exited_zero():
    job, _ = _gang_record()
    assert on_part_report(job, _started(job, 0, T0)).action == "save" and job.state == "placed"
    assert on_part_report(job, _started(job, 0, T0)).action == "ignore"  # redelivered
    assert on_part_report(job, _started(job, 1, T0 + timedelta(seconds=1))).action == "save"
    assert job.state == "running" and job.started_at == T0 + timedelta(seconds=1)
    assert on_part_report(job, _finished(job, 1, 0, T0 + timedelta(seconds=9))).action == "save"
    step = on_part_report(job, _finished(job, 0, 0, T0 + timedelta(seconds=10)))
    assert step.action == "succeeded" and job.exit_code == 0 and job.finished_at == T0 + timedelta(seconds=10)
    assert "running as a gang" not in why(job)


def test_a_failed_part_fails_the_gang_and_stops_the_parts_still_running():
    job, _ = _gang_record()
    on_part_report(job, _started(job, 0, T0))
    on_part_report(job, _started(job, 1, T0))
    assert "running as a gang on 2 nodes" in why(job) and "rank 1: n2" in why(job)
    step = on_part_report(job, _finished(job, 1, 3, T0 + timedelta(seconds=5)))
    assert (
        step.action == "failed"
        and [p.node for p in step.stop] == ["n1"]
        and "rank 1 on n2 failed (exit code 3)" in step.reason
    )
    failed_to_start = JobFailed(
        job_id="g1", attempt=1, cluster="c1", node="n1", reason="cannot start", failed_at=T0, rank=0
    )
    job2, _ = _gang_record()
    step2 = on_part_report(job2, failed_to_start)
    assert step2.action == "failed" and [p.rank for p in step2.stop] == [1]


def test_reports_from_a_node_that_is_not_that_part_are_ignored():
    job, _ = _gang_record()
    wrong = JobStarted(job_id="g1", attempt=1, cluster="c1", node="n1", gpu_uuids=[], pid=1, started_at=T0, rank=1)
    assert on_part_report(job, wrong).action == "ignore" and job.parts[1].state == "placed"


def _placed(rank: int | None, nodes: list[str] | None, env: dict[str, str] | None = None) -> JobPlaced:
    node = nodes[rank] if nodes and rank is not None else "n1"
    return JobPlaced(
        job_id="g1",
        attempt=2,
        cluster="c1",
        node=node,
        gpu_model="H100",
        gpu_uuids=[f"{node}-0", f"{node}-1"],
        gpu_indices=[0, 1],
        command=["train"],
        team="t",
        project="p",
        env=env or {},
        rank=rank,
        gang_nodes=nodes,
        gang_gpus=4 if nodes else None,
    )


def test_each_part_gets_its_gpus_its_rank_and_the_coordinator():
    env = job_environment(_placed(1, ["n1", "n2"]), base={"PATH": "/bin", "WHALEFLUX_ADMIN_TOKEN": "x"})
    assert env["CUDA_VISIBLE_DEVICES"] == "n2-0,n2-1" and env["WHALEFLUX_JOB_ID"] == "g1"
    assert (env["WHALEFLUX_NODE_RANK"], env["WHALEFLUX_NUM_NODES"], env["WHALEFLUX_COORDINATOR"]) == ("1", "2", "n1")
    assert (env["NODE_RANK"], env["NNODES"], env["MASTER_ADDR"]) == ("1", "2", "n1")
    assert (
        env["WHALEFLUX_GANG_GPUS"] == "4"
        and env["WHALEFLUX_GANG_NODES"] == "n1,n2"
        and "WHALEFLUX_ADMIN_TOKEN" not in env
    )
    # The job's own MASTER_ADDR wins; a one-node job is rank 0 of 1 and gets no torchrun names.
    assert gang_environment(_placed(0, ["n1", "n2"], {"MASTER_ADDR": "10.0.0.1"}), {}).get("MASTER_ADDR") is None
    single = gang_environment(_placed(None, None), {})
    assert single["WHALEFLUX_NODE_RANK"] == "0" and single["WHALEFLUX_NUM_NODES"] == "1" and "NODE_RANK" not in single
    assert log_name("g1", 2) == "g1.2.log" and log_name("g1", 2, 1) == "g1.2.rank1.log"


def _usage(rank: int, node: str, start_s: float, end_s: float | None) -> UsageRecord:
    r = UsageRecord(
        job_id="g1",
        attempt=1,
        team="t",
        project="p",
        gpu_model="H100",
        gpus=8,
        node=node,
        gpu_uuids=[f"{node}-{i}" for i in range(8)],
        started_at=T0 + timedelta(seconds=start_s),
        state="running",
        rank=rank,
    )
    return ended(r, T0 + timedelta(seconds=end_s), "finished") if end_s is not None else r


def test_a_gang_is_charged_once_for_every_gpu_on_every_node():
    parts = [_usage(0, "n1", 0, 100), _usage(1, "n2", 1, 100)]
    assert [p.ledger_key for p in parts] == ["g1:1", "g1:1#r1"] and ledger_key("g1", 1) == "g1:1"
    [merged] = merge_parts(parts)
    assert merged.gpus == 16 and merged.gpu_seconds == Decimal(8 * 100 + 8 * 99) and merged.nodes == ["n1", "n2"]
    assert merged.state == "finished" and merged.started_at == T0 and merged.ended_at == T0 + timedelta(seconds=100)
    ivs, jobs = intervals(parts, T0 + timedelta(seconds=200))
    assert len(ivs) == 16 and {iv.job for iv in ivs} == {"g1:1"} and list(jobs) == ["g1:1"]
    assert sum(iv.end_ms - iv.start_ms for iv in ivs) == (8 * 100 + 8 * 99) * 1000
    # While one part still runs, the attempt runs.
    [open_] = merge_parts([_usage(0, "n1", 0, 50), _usage(1, "n2", 0, None)])
    assert open_.ended_at is None and open_.state == "running"
    assert intervals([_usage(1, "n2", 0, None), _usage(0, "n1", 0, 50)], T0 + timedelta(seconds=60))[1]["g1:1"].running


def test_a_gang_stays_within_one_cluster_and_pool_and_says_so_when_none_is_large_enough():
    def reg(node, model, cluster, pool):
        ids = [
            GpuIdentity(uuid=f"{node}-{i}", index=i, model=model, name=model, memory_total_mib=143771) for i in range(8)
        ]
        return NodeRegistered(cluster=cluster, node=node, pool=pool, interconnect="nvlink", agent_version="t", gpus=ids)

    regs = [
        reg("h200-01", "H200", "cloud-a", "cloud"),
        reg("h100-01", "H100", "onprem", "onprem"),
        reg("a100-01", "A100", "onprem", "onprem"),
    ]
    cluster = ClusterState([node_state(NodeView(r), {}) for r in regs])
    p = place_on(cluster, job_request("g", _spec(gpus=12, workload_class="llm-train")), PROFILE, 0.0)
    assert isinstance(p, Placement) and sorted(s.node for s in p.shares) == ["a100-01", "h100-01"], p
    assert "onprem/onprem" in p.explanation
    too_big = infeasible_reason(regs, job_request("g", _spec(gpus=20)), PROFILE)
    assert too_big and "one cluster and pool" in too_big and "16 GPUs" in too_big
