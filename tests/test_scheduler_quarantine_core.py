"""The GPU quarantine rule (pure): faults, silences, the hold time, operators' cordons, and what placement makes
of a quarantined GPU."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from whaleflux.scheduler.placement import FIRST_FIT, ClusterState, JobRequest, Placement, place_on
from whaleflux.scheduler.quarantine import (
    Gpu,
    Problem,
    QuarantinePolicy,
    Step,
    alert_ended,
    alert_fired,
    cordon,
    judge,
    missing_problem,
    sample_problem,
    uncordon,
)
from whaleflux.scheduler.records import GpuQuarantine, JobRecord
from whaleflux.scheduler.schedule_request import NodeView, node_state
from whaleflux.scheduler.why import why
from whaleflux.shared.events import (
    EventData,
    GpuCordoned,
    GpuIdentity,
    GpuSample,
    GpuUncordoned,
    JobSubmitted,
    NodeRegistered,
)
from whaleflux.shared.gpu_flags import flags

T0 = datetime(2026, 3, 1, tzinfo=UTC)
POLICY = QuarantinePolicy(hold_s=300, missing_s=30)
GPU = Gpu("c1", "h100-01", "h100-01-3", 3)


def _sample(**kw) -> GpuSample:
    base = {"uuid": GPU.uuid, "index": GPU.index, "model": "H100", "utilization_gpu_pct": 0.0,
            "memory_used_mib": 1.0, "memory_total_mib": 81559, "temperature_c": 35.0, "ecc_uncorrected": 0,
            "remapped_rows_uncorrectable": 0, "row_remap_failure": False}
    return GpuSample(**{**base, **kw})


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def done(step: Step | None) -> Step:
    """A judgement that changed something."""
    assert step is not None
    return step


def kept(step: Step | None) -> GpuQuarantine:
    """The quarantine a judgement keeps."""
    record = done(step).record
    assert record is not None
    return record


def event(step: Step | None) -> EventData:
    announced = done(step).event
    assert announced is not None
    return announced.data


def faulty(problem: Problem, s: float = 0, gpu: Gpu = GPU) -> GpuQuarantine:
    return kept(judge(None, gpu, problem, False, at(s), POLICY))


def test_fatal_xids_and_uncorrectable_ecc_are_faults_other_xids_are_not():
    assert sample_problem(_sample(xid_errors=[79])) == Problem("xid", "XID 79")
    for xid in (48, 94, 95):
        problem = sample_problem(_sample(xid_errors=[xid]))
        assert problem is not None and problem.cause == "xid", xid
    assert sample_problem(_sample(xid_errors=[13, 31])) is None  # a graphics engine fault, a page fault: the job's
    assert sample_problem(_sample()) is None
    ecc = sample_problem(_sample(ecc_uncorrected=2))
    assert ecc is not None and ecc.cause == "ecc" and "2 uncorrectable" in ecc.reason
    remap = sample_problem(_sample(row_remap_failure=True))
    assert remap is not None and remap.cause == "ecc"
    # The telemetry views flag what quarantines: one rule (shared/gpu_flags.py).
    assert "ecc" in flags(_sample(row_remap_failure=True), None, False)


def test_ecc_errors_an_operator_accepted_quarantine_only_when_more_come():
    assert sample_problem(_sample(ecc_uncorrected=2), accepted_ecc=2) is None
    assert sample_problem(_sample(ecc_uncorrected=3), accepted_ecc=2) is not None


def test_a_fault_quarantines_and_announces_it_once():
    step = judge(None, GPU, Problem("xid", "XID 79"), False, at(0), POLICY)
    record, data = kept(step), event(step)
    assert record.cause == "xid" and record.since == at(0)
    assert isinstance(data, GpuCordoned) and data.gpu_index == 3
    announced = done(step).event
    assert announced is not None and announced.subject == "gpu.cordoned.c1.h100-01"
    # The same fault seen again changes nothing.
    assert judge(record, GPU, Problem("xid", "XID 79"), False, at(1), POLICY) is None


def test_a_faulty_gpu_comes_back_only_after_reporting_healthy_for_the_whole_hold():
    record = faulty(Problem("ecc", "1 uncorrectable"))
    started = judge(record, GPU, None, True, at(10), POLICY)
    assert kept(started).healthy_since == at(10) and done(started).event is None
    record = kept(started)
    assert judge(record, GPU, None, True, at(309), POLICY) is None, "299 s healthy is not 300"
    # A fault inside the hold starts it over.
    broken = kept(judge(record, GPU, Problem("ecc", "2 uncorrectable"), False, at(200), POLICY))
    assert broken.healthy_since is None
    again = kept(judge(broken, GPU, None, True, at(250), POLICY))
    assert judge(again, GPU, None, True, at(549), POLICY) is None
    over = judge(again, GPU, None, True, at(550), POLICY)
    assert done(over).record is None
    data = event(over)
    assert isinstance(data, GpuUncordoned) and data.by == "scheduler"


def test_being_merely_not_missing_proves_nothing_healthy():
    record = faulty(Problem("missing", "no telemetry"))
    assert judge(record, GPU, None, False, at(1000), POLICY) is None


def test_a_zero_hold_releases_at_the_first_healthy_sample():
    record = faulty(Problem("xid", "XID 48"))
    assert done(judge(record, GPU, None, True, at(1), QuarantinePolicy(hold_s=0))).record is None


def test_an_operators_cordon_holds_whatever_the_samples_say_until_the_operator_lifts_it():
    step = cordon(None, GPU, "fan noise", at(0))
    record = kept(step)
    assert record.cause == "operator" and isinstance(event(step), GpuCordoned)
    for s in (10, 400, 100_000):
        assert judge(record, GPU, None, True, at(s), POLICY) is None
    assert cordon(record, GPU, "again", at(5)) is None
    # A cordon replaces a fault's quarantine: the hold no longer lets it go.
    assert kept(cordon(faulty(Problem("xid", "XID 79")), GPU, "wait for RMA", at(1))).cause == "operator"
    lifted = uncordon(record, accepted_ecc=2)
    assert done(lifted).record is None
    data = event(lifted)
    assert isinstance(data, GpuUncordoned) and data.by == "operator" and data.accepted_ecc_errors == 2
    assert uncordon(None, 0) is None


def test_an_operator_clears_a_faults_quarantine_before_its_hold():
    assert done(uncordon(faulty(Problem("ecc", "1 uncorrectable")), accepted_ecc=1)).record is None


def test_a_gpu_is_missing_only_while_its_node_heartbeats_and_sends_telemetry():
    # last sample, node's last batch, node heard, watching since, now
    assert missing_problem(60.0, 99.0, 99.5, 0.0, 100.0, POLICY) is not None
    assert missing_problem(75.0, 99.0, 99.5, 0.0, 100.0, POLICY) is None, "25 s is not 30"
    assert missing_problem(60.0, 99.0, 50.0, 0.0, 100.0, POLICY) is None, "a silent node is failover's"
    assert missing_problem(60.0, 50.0, 99.5, 0.0, 100.0, POLICY) is None, "a node without telemetry is not judged"
    assert missing_problem(60.0, None, 99.5, 0.0, 100.0, POLICY) is None
    # Never sampled since we started watching: counted from then, never blamed for our own downtime.
    assert missing_problem(None, 99.0, 99.5, 80.0, 100.0, POLICY) is None
    problem = missing_problem(None, 99.0, 99.5, 60.0, 100.0, POLICY)
    assert problem is not None and problem.cause == "missing" and "40 s" in problem.reason
    assert missing_problem(10.0, 99.0, 99.5, 80.0, 100.0, POLICY) is None


def _reg(gpus: int = 4) -> NodeRegistered:
    ids = [GpuIdentity(uuid=f"h100-01-{i}", index=i, model="H100", name="H100", memory_total_mib=81559)
           for i in range(gpus)]
    return NodeRegistered(cluster="c1", node="h100-01", pool="onprem", interconnect="nvlink", agent_version="t",
                          gpus=ids)


def test_placement_never_hands_out_a_quarantined_gpu_even_when_the_job_on_it_ends():
    view = NodeView(_reg(), quarantined=frozenset({"h100-01-3", "h100-01-1"}))
    cluster = ClusterState([node_state(view, {"h100-01-1": "old"})])
    assert cluster.free["h100-01"] == [0, 2] and cluster.total_free == 2
    three = place_on(cluster, JobRequest("j", 3), FIRST_FIT, 0.0)
    assert not isinstance(three, Placement)
    two = place_on(cluster, JobRequest("j", 2), FIRST_FIT, 0.0)
    assert isinstance(two, Placement) and set(two.gpu_indices) == {0, 2}
    (share,) = cluster.holdings["old"]
    assert cluster.freeable(share) == 0
    cluster.release("old")  # the job on a quarantined GPU ended: the GPU stays out
    assert cluster.free["h100-01"] == [0, 2] and cluster.total_free == 2


def test_a_drained_node_undrained_keeps_its_quarantined_gpus_out():
    from whaleflux.scheduler.records import NodeCondition

    quarantined = frozenset({"h100-01-2"})
    drained = node_state(NodeView(_reg(), NodeCondition(state="draining", reason="x", since=T0),
                                  quarantined=quarantined), {})
    undrained = node_state(NodeView(_reg(), None, quarantined=quarantined), {})
    assert drained.draining and not undrained.draining
    assert [g.index for g in undrained.gpus if g.quarantined] == [2]
    assert ClusterState([undrained]).free["h100-01"] == [0, 1, 3]


def test_why_names_the_quarantined_gpus_that_matter_to_the_job():
    q = faulty(Problem("xid", "XID 79"))
    other = faulty(Problem("missing", "no telemetry for 31 s"), gpu=Gpu("c1", "a100-01", "a100-01-0", 0))
    models = {"h100-01": "H100", "a100-01": "A100"}
    spec = JobSubmitted(job_id="j", name="x", command=["true"], gpus=4, gpu_models=["H100"])
    waiting = JobRecord(job_id="j", spec=spec, submitted_at=T0, reason="needs 4 GPUs")
    text = why(waiting, [q, other], models)
    assert "quarantined: h100-01 GPU 3 (xid: XID 79" in text and "a100-01" not in text
    anywhere = JobRecord(job_id="j", spec=spec.model_copy(update={"gpu_models": []}), submitted_at=T0)
    assert "a100-01 GPU 0 (missing" in why(anywhere, [q, other], models)
    running = JobRecord(job_id="j", spec=spec, submitted_at=T0, state="running", node="h100-01",
                        gpu_model="H100", gpu_uuids=["h100-01-3", "h100-01-2"], attempt=1)
    text = why(running, [q, other], models)
    assert "running on h100-01" in text and "h100-01 GPU 3" in text and "a100-01" not in text
    many = [faulty(Problem("xid", "XID 79"), gpu=Gpu("c1", f"h100-{n:02d}", f"u{n}", 0)) for n in range(2, 15)]
    lines = why(waiting, many, {f"h100-{n:02d}": "H100" for n in range(2, 15)}).splitlines()
    assert len(lines) == 12 and lines[-1] == "quarantined: 3 more GPU(s) (whaleflux gpus list)"


def _commit(current: GpuQuarantine | None, step: Step | None) -> GpuQuarantine | None:
    return current if step is None else step.record


def test_a_critical_alert_takes_a_gpu_out_until_every_alert_on_it_resolves():
    first = alert_fired(None, GPU, "fp-hot", "GPUTemperatureHigh", T0)
    assert first is not None and first.record is not None and first.event is not None
    assert isinstance(first.event.data, GpuCordoned)
    assert (first.record.cause, first.record.reason) == ("alert", "GPUTemperatureHigh firing")
    assert first.event.data.cause == "alert"
    assert alert_fired(first.record, GPU, "fp-hot", "GPUTemperatureHigh", T0) is None  # raised again: no change
    both = _commit(first.record, alert_fired(first.record, GPU, "fp-xid", "GPUXidDrain", T0))
    assert both is not None and both.reason == "GPUTemperatureHigh, GPUXidDrain firing"
    one_left = _commit(both, alert_ended(both, "fp-xid", "GPUXidDrain"))
    assert one_left is not None and one_left.alerts == {"fp-hot": "GPUTemperatureHigh"}
    ended = alert_ended(one_left, "fp-hot", "GPUTemperatureHigh")
    assert ended is not None and ended.record is None and ended.event is not None
    assert isinstance(ended.event.data, GpuUncordoned)
    assert alert_ended(None, "fp-hot", "GPUTemperatureHigh") is None


def test_healthy_samples_never_hand_back_a_gpu_whose_critical_alert_fires():
    out = _commit(None, alert_fired(None, GPU, "fp-hot", "GPUTemperatureHigh", T0))
    assert judge(out, GPU, None, True, T0 + timedelta(hours=1), POLICY) is None
    # A fault's quarantine whose hold ends while an alert fires: out for the alert from then on.
    xid = _commit(None, judge(None, GPU, Problem("xid", "XID 79"), False, T0, POLICY))
    xid = _commit(xid, alert_fired(xid, GPU, "fp-xid", "GPUXidDrain", T0))
    assert xid is not None and xid.cause == "xid"
    xid = _commit(xid, judge(xid, GPU, None, True, T0 + timedelta(seconds=1), POLICY))
    held = judge(xid, GPU, None, True, T0 + timedelta(seconds=302), POLICY)
    assert held is not None and held.record is not None and held.event is None
    assert (held.record.cause, held.record.reason) == ("alert", "GPUXidDrain firing")


def test_an_alert_on_a_cordoned_gpu_leaves_the_cordon_and_an_operator_uncordon_lifts_all():
    cordoned_ = _commit(None, cordon(None, GPU, "fan swap", T0))
    assert cordoned_ is not None
    with_alert = _commit(cordoned_, alert_fired(cordoned_, GPU, "fp-hot", "GPUTemperatureHigh", T0))
    assert with_alert is not None and (with_alert.cause, with_alert.reason) == ("operator", "fan swap")
    assert _commit(with_alert, alert_ended(with_alert, "fp-hot", "GPUTemperatureHigh")).cause == "operator"  # type: ignore[union-attr]
    lifted = uncordon(with_alert, 0)
    assert lifted is not None and lifted.record is None


def test_a_rebuilt_alert_quarantine_without_fingerprints_ends_with_the_resolution_of_a_rule_it_names():
    rebuilt = GpuQuarantine(cluster="c1", node="h100-01", uuid=GPU.uuid, index=3, cause="alert",
                            reason="GPUTemperatureHigh firing", since=T0)
    assert alert_ended(rebuilt, "fp-other", "GPUThermalThrottle") is None  # another rule's (a warning's) end
    step = alert_ended(rebuilt, "fp-unknown", "GPUTemperatureHigh")
    assert step is not None and step.record is None


def test_an_undrain_says_which_gpus_stay_cordoned_and_why():
    from whaleflux.scheduler.api import StaysOut, undrain_said

    stays = [StaysOut(gpu=3, cause="alert", reason="GPUTemperatureHigh firing"),
             StaysOut(gpu=5, cause="operator", reason="fan swap")]
    assert undrain_said("h100-01", True, stays, []) == ("h100-01 undrained; GPU 3 stays cordoned: GPUTemperatureHigh "
                                                        "firing; GPU 5 stays cordoned: operator: fan swap")
    assert undrain_said("h100-01", False, [], [3]) == "h100-01 was not draining; GPU 3 uncordoned (forced)"
