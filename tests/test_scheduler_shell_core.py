"""Pure pieces of the scheduler shell: node liveness, records -> queue policy request, reasons."""

from __future__ import annotations

from datetime import datetime, timezone

from whaleflux.scheduler.liveness import LivenessPolicy, assess
from whaleflux.scheduler.placement import FIRST_FIT, Profile
from whaleflux.scheduler.records import JobRecord, NodeCondition
from whaleflux.scheduler.routes import why
from whaleflux.scheduler.schedule_request import (
    NodeView,
    infeasible_reason,
    job_request,
    node_state,
    waiting_reasons,
)
from whaleflux.shared.events import GpuIdentity, JobSubmitted, NodeRegistered

POLICY = LivenessPolicy(suspect_after_s=5, lost_after_s=10, mass_silence_fraction=0.5)
T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)


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


def _reg(node: str, model: str = "H100", gpus: int = 8, interconnect: str = "nvlink", pool: str = "onprem") -> NodeRegistered:
    ids = [GpuIdentity(uuid=f"{node}-{i}", index=i, model=model, name=model, memory_total_mib=81559) for i in range(gpus)]
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
    assert "only" in infeasible_reason(regs, job_request("a", _spec(gpus=16)), profile)
    assert "pool" in infeasible_reason(regs, job_request("b", _spec(labels={"pool": "nowhere"})), profile)
    assert "GPU memory below" in infeasible_reason(regs, job_request("c", _spec(min_memory_mib=200 * 1024)), profile)
    assert "not allowed" in infeasible_reason(regs, job_request("d", _spec(gpu_models=["B200"])), profile)
    assert infeasible_reason(regs, job_request("e", _spec(gpus=4, nvlink=True)), FIRST_FIT) is None
    only_pcie = [_reg("r4090-01", "RTX4090", 4, "pcie", "dev")]
    assert "not NVLink" in infeasible_reason(only_pcie, job_request("f", _spec(gpus=2, nvlink=True)), profile)
    assert infeasible_reason([], job_request("g", _spec(gpus=999)), profile) is None


def test_waiting_reasons_say_how_many_jobs_are_ahead():
    reasons = waiting_reasons({"b": "needs 4 GPUs", "a": "needs 1 GPU"}, ["a", "b", "c"], "no GPU free")
    assert reasons == {
        "b": "needs 4 GPUs; first in line",
        "a": "needs 1 GPU; 1 job(s) ahead",
        "c": "no GPU free; 2 job(s) ahead",
    }


def test_why_tells_where_a_job_runs_and_each_requeue():
    job = JobRecord(job_id="j1", spec=_spec(), submitted_at=T0, state="running", attempt=2, node="a100-01",
                    gpu_model="A100", gpu_uuids=["u1"], placed_because="a100-01 (A100): speed 1.00x",
                    requeues=["attempt 1 on h100-01: node lost: no heartbeat for 11 s"])
    text = why(job)
    assert "running on a100-01 (A100), attempt 2" in text and "speed 1.00x" in text
    assert "requeued: attempt 1 on h100-01: node lost" in text
