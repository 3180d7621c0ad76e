"""Pure pieces of the scheduler shell: node liveness, records -> queue policy request, reasons."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from whaleflux.scheduler.liveness import LivenessPolicy, assess, judged_from, watch_start
from whaleflux.scheduler.placement import FIRST_FIT, ClusterState, ModelFacts, Profile
from whaleflux.scheduler.queueing import PendingQueue, ScheduleRequest, schedule
from whaleflux.scheduler.records import JobPart, JobRecord, NodeCondition
from whaleflux.scheduler.schedule_request import (
    NodeView,
    assumed_end,
    held,
    infeasible_reason,
    job_request,
    movable,
    node_state,
    pending_job,
    running_job,
)
from whaleflux.scheduler.settings import SchedulerSettings
from whaleflux.scheduler.transitions import requeue, stop_orders
from whaleflux.scheduler.why import why
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import GpuIdentity, JobSubmitted, NodeRegistered

POLICY = LivenessPolicy(suspect_after_s=5, lost_after_s=10, mass_silence_fraction=0.5)
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def test_a_short_silence_is_suspect_and_a_long_one_lost():
    seen = {"a": 100.0, "b": 94.0, "c": 89.0, "d": 99.0, "e": 99.5}
    live = assess(seen, now=100.0, since=0.0, policy=POLICY)
    assert live.suspect == {"b"} and live.lost == {"c"} and not live.mass_silence


def test_when_most_nodes_go_silent_together_nothing_is_lost_or_suspect():
    seen = {"a": 100.0, "b": 80.0, "c": 80.0}
    live = assess(seen, now=100.0, since=0.0, policy=POLICY)
    assert live.mass_silence and live.lost == set() and live.suspect == set() and live.held_back == {"b", "c"}


def test_half_the_fleet_silent_is_not_most_of_it():
    live = assess({"a": 100.0, "b": 80.0}, now=100.0, since=0.0, policy=POLICY)
    assert live.lost == {"b"} and not live.mass_silence


def test_a_restarted_scheduler_does_not_blame_nodes_for_its_own_downtime():
    seen = {"a": 10.0, "b": 50.0, "c": 10.0}
    assert assess(seen, now=100.0, since=95.0, policy=POLICY).lost == set()
    assert assess(seen, now=100.0, since=89.0, policy=POLICY).mass_silence  # all silent since it came back
    assert assess({"a": 10.0, "b": 99.0, "c": 99.0}, now=100.0, since=89.0, policy=POLICY).lost == {"a"}


def test_a_node_that_registers_and_dies_before_its_first_heartbeat_is_judged_by_its_registration():
    # "new" registered at 85 and never spoke; "old" registered before this scheduler watched and was never heard
    # since; "back" re-registered after its last heartbeat; "gone" is lost already (out of the count).
    registered = ["a", "b", "new", "old", "back", "gone"]
    heard = {"a": 99.0, "b": 99.0, "back": 70.0, "gone": 10.0}
    seen = judged_from(registered, heard, {"new": 85.0, "back": 96.0, "a": 50.0}, out={"gone"})
    assert seen == {"a": 99.0, "b": 99.0, "new": 85.0, "old": 0.0, "back": 96.0}
    live = assess(seen, now=100.0, since=80.0, policy=POLICY)
    assert live.lost == {"new", "old"} and live.suspect == set()
    # Never blamed for time the scheduler was not watching: both age from `since` when it came later.
    live = assess(seen, now=100.0, since=92.0, policy=POLICY)
    assert live.lost == set() and live.suspect == {"new", "old"}


def test_nodes_still_silent_when_a_mass_silence_ends_get_a_grace_period_before_any_is_lost():
    # Three of four nodes silent: a storm, nothing lost. Then one speaks again: two of four silent is
    # no longer "most", but they were silent for the same reason and are not lost at once.
    since, in_storm = 0.0, False
    live = assess({"a": 100.0, "b": 80.0, "c": 80.0, "d": 80.0}, now=100.0, since=since, policy=POLICY)
    assert live.mass_silence and not live.lost
    since, in_storm = watch_start(in_storm, live, since, 100.0), live.mass_silence
    seen = {"a": 101.0, "b": 101.0, "c": 80.0, "d": 80.0}
    live = assess(seen, now=101.0, since=since, policy=POLICY)
    assert not live.mass_silence and live.lost == {"c", "d"}, "without memory they would be lost at once"
    since = watch_start(in_storm, live, since, 101.0)
    assert assess(seen, now=101.0, since=since, policy=POLICY).lost == set()
    talking = {**seen, "a": 111.0, "b": 111.0}
    assert assess(talking, now=110.5, since=since, policy=POLICY).lost == set()
    late = assess(talking, now=111.5, since=since, policy=POLICY)
    assert late.lost == {"c", "d"}, "still silent after the grace: lost"


def _reg(node: str, model: str = "H100", gpus: int = 8, interconnect: str = "nvlink",
         pool: str = "onprem") -> NodeRegistered:
    ids = [GpuIdentity(uuid=f"{node}-{i}", index=i, model=model, name=model, memory_total_mib=81559)
           for i in range(gpus)]
    return NodeRegistered(cluster="c1", node=node, pool=pool, interconnect=interconnect, agent_version="t", gpus=ids)


def _spec(**kw) -> JobSubmitted:
    return JobSubmitted(job_id=kw.pop("job_id", "j1"), name="x", command=["true"], **kw)


def test_job_spec_becomes_a_placement_request_with_pool_labels_and_nvlink():
    spec = _spec(gpus=4, labels={"pool": "onprem", "rack": "r1"}, nvlink=True, priority="high", preemptible=True,
                 workload_class="llm-train", team="nlp")
    req = job_request("j1", spec)
    assert req.pool == "onprem" and req.labels == (("rack", "r1"),) and req.nvlink
    assert (req.priority, req.preemptible, req.workload_class, req.team) == ("high", True, "llm-train", "nlp")
    assert not job_request("j1", _spec(gpus=1, nvlink=True)).nvlink  # one GPU needs no link


def test_suspect_lost_and_draining_nodes_take_no_new_work_but_keep_their_jobs():
    reg = _reg("h100-01")
    alloc = {"h100-01-0": "busy"}
    healthy = node_state(NodeView(reg), alloc)
    assert healthy.schedulable and not healthy.draining and healthy.gpus[0].allocated_to == "busy"
    assert healthy.model == "H100" and healthy.labels["pool"] == "onprem"
    assert not node_state(NodeView(reg, suspect=True), alloc).schedulable
    lost = NodeCondition(state="lost", reason="silent", since=T0)
    assert not node_state(NodeView(reg, lost), alloc).schedulable
    drained = node_state(NodeView(reg, NodeCondition(state="draining", reason="alert", since=T0)), alloc)
    assert drained.draining and NodeView(reg, lost).status == "lost"


def test_infeasible_jobs_are_named_at_submission_and_unknown_fleets_judge_nothing():
    regs = [_reg("h100-01"), _reg("r4090-01", "RTX4090", 4, "pcie", "dev")]
    profile = Profile()

    def reason(nodes: list[NodeRegistered], job_id: str, **spec: object) -> str:
        return infeasible_reason(nodes, job_request(job_id, _spec(**spec)), profile) or ""

    assert "only" in reason(regs, "a", gpus=16)
    assert "pool" in reason(regs, "b", labels={"pool": "nowhere"})
    assert "GPU memory below" in reason(regs, "c", min_memory_mib=200 * 1024)
    assert "not allowed" in reason(regs, "d", gpu_models=["B200"])
    assert infeasible_reason(regs, job_request("e", _spec(gpus=4, nvlink=True)), FIRST_FIT) is None
    only_pcie = [_reg("r4090-01", "RTX4090", 4, "pcie", "dev")]
    assert "not NVLink" in reason(only_pcie, "f", gpus=2, nvlink=True)
    assert infeasible_reason([], job_request("g", _spec(gpus=999)), profile) is None


def test_why_tells_where_a_job_runs_and_each_requeue():
    job = JobRecord(job_id="j1", spec=_spec(), submitted_at=T0, state="running", attempt=2, node="a100-01",
                    gpu_model="A100", gpu_uuids=["u1"], placed_because="a100-01 (A100): speed 1.00x",
                    requeues=["attempt 1 on h100-01: node lost: no heartbeat for 11 s"])
    text = why(job)
    assert "running on a100-01 (A100), attempt 2" in text and "speed 1.00x" in text
    assert "requeued: attempt 1 on h100-01: node lost" in text


def _on(node: str, job_id: str, model: str, *, state: str = "running", **spec) -> JobRecord:
    """A record of a 2-GPU llm-train job holding GPUs 0-1 (`job_id` "mover") or 2-3 of `node`."""
    first = 0 if job_id == "mover" else 2
    return JobRecord(
        job_id=job_id,
        spec=_spec(job_id=job_id, gpus=2, gpu_models=["H100", "A100"], workload_class="llm-train", **spec),
        submitted_at=T0, state=state, attempt=1, cluster="c1", node=node, gpu_model=model,
        gpu_uuids=[f"{node}-{first}", f"{node}-{first + 1}"], started_at=T0, expected_end=T0.timestamp() + 36000,
    )


def _cluster(records: list[JobRecord]) -> ClusterState:
    alloc = {u: r.job_id for r in records for u in r.gpu_uuids}
    facts = {key: ModelFacts(key, dict(m.speed)) for key, m in gpu_models().items()}
    return ClusterState([node_state(NodeView(reg), alloc) for reg in (_reg("h100-01"), _reg("a100-01", "A100"))], facts)


def test_only_running_one_node_jobs_that_resume_from_a_checkpoint_they_keep_may_move():
    assert movable(_on("a100-01", "mover", "A100", preemptible=True))
    assert movable(_on("a100-01", "mover", "A100", checkpoint_dir="/ck/mover"))
    # resume=restart would lose its work; the default checkpoint dir alone says nothing about the job.
    assert not movable(_on("a100-01", "mover", "A100", preemptible=True, resume="restart"))
    assert not movable(_on("a100-01", "mover", "A100"))
    assert not movable(_on("a100-01", "mover", "A100", state="placed", preemptible=True))
    gang = _on("a100-01", "mover", "A100", preemptible=True)
    gang.parts = [JobPart(rank=i, cluster="c1", node=n, gpu_model="A100", gpu_uuids=[f"{n}-0"], gpu_indices=[0])
                  for i, n in enumerate(("a100-01", "a100-02"))]
    assert not movable(gang)


def test_a_moved_job_is_held_until_its_old_attempt_ended_or_the_hold_ran_out():
    job = _on("a100-01", "mover", "A100", state="pending")
    assert not held(job, T0)
    job.held_until = T0 + timedelta(seconds=12)
    assert held(job, T0 + timedelta(seconds=11)) and not held(job, T0 + timedelta(seconds=12))


def test_the_service_policy_moves_a_checkpointable_job_to_free_faster_gpus_and_never_a_restart_one():
    mover = _on("a100-01", "mover", "A100", preemptible=True)
    mover.migrations = 1
    stayer = _on("a100-01", "stayer", "A100", preemptible=True, resume="restart")
    cluster = _cluster([mover, stayer])
    running = {r.job_id: running_job(r, cluster) for r in (mover, stayer)}
    view = running["mover"]
    assert view.checkpointable and view.request is not None and view.migrations == 1
    assert view.request.gpu_models == ("H100", "A100")
    assert view.speed == pytest.approx(cluster.speed("A100", "llm-train"))  # 2 GPUs on NVLink: no penalty
    assert not running["stayer"].checkpointable and running["stayer"].request is None
    assert running_job(mover).request is None  # without the cluster, no speed: never moved

    policy = SchedulerSettings(environment="development").policy_config()
    reply = schedule(ScheduleRequest(T0.timestamp() + 60, cluster, PendingQueue(policy), running, policy))
    [move] = reply.migrated
    assert move.job_id == "mover" and move.placement.model == "H100" and "faster GPUs" in move.reason

    # The move count carried in the record stops it: no loops.
    mover.migrations = policy.max_migrations_per_job
    again = {r.job_id: running_job(r, _cluster([mover, stayer])) for r in (mover, stayer)}
    cluster = _cluster([mover, stayer])
    reply = schedule(ScheduleRequest(T0.timestamp() + 60, cluster, PendingQueue(policy), again, policy))
    assert reply.migrated == []
    # Turned off in the settings: nothing moves.
    off = SchedulerSettings(environment="development", migration=False).policy_config()
    unmoved = _on("a100-01", "mover", "A100", preemptible=True)
    fresh = _cluster([unmoved, stayer])
    running = {r.job_id: running_job(r, fresh) for r in (unmoved, stayer)}
    assert running["mover"].checkpointable and running["mover"].migrations == 0
    assert schedule(ScheduleRequest(T0.timestamp() + 60, fresh, PendingQueue(off), running, off)).migrated == []


def test_the_service_policy_moves_a_checkpointable_job_out_of_the_way_of_a_blocked_one():
    # a100-01 is full (the mover on GPUs 0-1, a job that may not move on 2-7); two H100s are free.
    mover = _on("a100-01", "mover", "A100", preemptible=True)
    filler = _on("a100-01", "filler", "A100")
    filler.gpu_uuids = [f"a100-01-{i}" for i in range(2, 8)]
    holder = _on("h100-01", "holder", "H100")
    holder.gpu_uuids = [f"h100-01-{i}" for i in range(6)]
    cluster = _cluster([mover, filler, holder])
    running = {r.job_id: running_job(r, cluster) for r in (mover, filler, holder)}
    policy = SchedulerSettings(environment="development").policy_config()
    queue = PendingQueue(policy)
    queue.add(pending_job(JobRecord(job_id="head", spec=_spec(job_id="head", gpus=2, gpu_models=["A100"]),
                                    submitted_at=T0), 0))
    reply = schedule(ScheduleRequest(T0.timestamp() + 60, cluster, queue, running, policy))
    [move] = reply.migrated
    assert move.job_id == "mover" and move.placement.node == "h100-01" and "make room for head" in move.reason
    [started] = reply.started
    assert started.job.job_id == "head" and started.placement.node == "a100-01"


def test_a_running_job_without_an_estimate_is_assumed_to_end_by_its_workload_class():
    t0 = T0.timestamp()
    train = JobRecord(job_id="t", spec=_spec(workload_class="llm-train"), submitted_at=T0, state="running",
                      started_at=T0)
    assert assumed_end(train, now=t0 + 60) == t0 + 24 * 3600
    assert assumed_end(train, now=t0 + 30 * 3600) == t0 + 30 * 3600 + 300, "past it: assumed to end soon"
    service = JobRecord(job_id="s", spec=_spec(workload_class="inference"), submitted_at=T0, state="running",
                        started_at=T0)
    assert assumed_end(service, now=t0) is None, "a service may run indefinitely"
    estimated = train.model_copy(update={"expected_end": t0 + 100})
    assert assumed_end(estimated, now=t0) is None and running_job(estimated).expected_end == t0 + 100


def test_a_requeued_job_names_its_stopped_attempt_and_a_moved_one_counts_a_migration_not_a_preemption():
    hold = T0 + timedelta(seconds=15)
    preempted = _on("h100-01", "mover", "H100")
    back = requeue(preempted, "preempted", "for a high-priority job", hold, moved=False, now=T0)
    assert preempted.state == "pending" and preempted.gpu_uuids == [] and preempted.held_until == hold
    assert (preempted.preemptions, preempted.migrations) == (1, 0)
    assert preempted.reason == ("requeued: for a high-priority job; placed again once attempt 1 has stopped "
                                "on h100-01")
    assert back.released == ["h100-01-0", "h100-01-1"] and back.parts == [(0, "c1", "h100-01")]
    assert (back.event.subject, back.event.event_id) == ("job.requeued", "requeued-mover-1")
    [order] = stop_orders(preempted, back.parts, "for a high-priority job", 5.0)
    assert (order.subject, order.event_id) == ("job.preempted.c1.h100-01", "preempted-mover-1")

    moved = _on("a100-01", "mover", "A100")
    requeue(moved, "preempted", "to faster GPUs", None, moved=True, now=T0)
    assert (moved.preemptions, moved.migrations) == (0, 1) and moved.reason == "moved: to faster GPUs"
    assert moved.requeues == ["attempt 1 on a100-01: to faster GPUs"]
