"""Why a job waits, in a person's words (issue 37 items 4 and 6), pure: moments in local time and how far off
("in 2 h 10 min"), the nodes named, a lease's end date; a job that can never fit judged by what an idle GPU
offers (telemetry), not its nameplate, refused naming the largest node and what it lacks, and holding no
reservation that delays others."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from whaleflux.scheduler.feeds import DRIVER_RESERVE_MIB, idle_memory
from whaleflux.scheduler.placement import (
    ClusterState,
    GpuState,
    JobRequest,
    NodeState,
    Placement,
    Profile,
    explain_wait,
    place_on,
)
from whaleflux.scheduler.placement.filters import FilterSettings, gb, lease_covers_runtime, needs
from whaleflux.scheduler.placement.moments import at, in_words, moment, span
from whaleflux.scheduler.queueing import (
    WHALEFLUX,
    PendingJob,
    PendingQueue,
    RunningJob,
    RunningJobs,
    ScheduleRequest,
    schedule,
)
from whaleflux.scheduler.queueing.reservation import Reservation
from whaleflux.scheduler.records import GpuQuarantine, JobRecord
from whaleflux.scheduler.schedule_request import infeasible_reason, job_request
from whaleflux.scheduler.why import quarantine_line, reason_key, spoken, why
from whaleflux.shared.events import GpuIdentity, GpuProcess, GpuSample, GpuTelemetry, JobSubmitted, NodeRegistered

CET = timezone(timedelta(hours=1), "CET")
NOW = datetime(2026, 12, 6, 9, 20, tzinfo=CET)  # a Sunday
H100_MIB = 81559  # the H100's nameplate (shared/data/gpu_models.yaml): 79.65 GB
H100_IDLE_MIB = H100_MIB - 1 - DRIVER_RESERVE_MIB  # what an idle one shows free: 79.4 GB


@pytest.mark.parametrize(("seconds", "words"), [
    (0, "0 s"), (45, "45 s"), (60, "1 min"), (12 * 60 + 20, "12 min"), (3600, "1 h"),
    (2 * 3600 + 10 * 60, "2 h 10 min"),
    (24 * 3600, "1 d"), (3 * 86400 + 4 * 3600 + 59, "3 d 4 h"), (-7 * 60, "7 min"),
])
def test_a_span_of_time_in_words(seconds, words):
    assert span(seconds) == words


def test_a_moment_today_is_its_local_time_and_how_far_off():
    assert moment(NOW.timestamp() + 2 * 3600 + 10 * 60, NOW) == "11:30 CET (in 2 h 10 min)"
    assert moment(NOW.timestamp() - 5 * 60, NOW) == "09:15 CET (5 min ago)"
    assert moment(NOW.timestamp(), NOW) == "09:20 CET (now)"


def test_a_moment_on_another_day_has_its_date_and_another_year_its_year():
    assert moment(datetime(2026, 12, 7, 14, 30, tzinfo=CET).timestamp(), NOW) == "Mon 7 Dec 14:30 CET (in 1 d 5 h)"
    assert moment(datetime(2027, 1, 4, 8, 0, tzinfo=CET).timestamp(), NOW).startswith("Mon 4 Jan 2027 08:00 CET (in ")


def test_the_same_moment_reads_in_the_readers_zone():
    t = datetime(2026, 12, 6, 10, 0, tzinfo=UTC).timestamp()
    assert in_words(f"starts {at(t)}", NOW) == "starts 11:00 CET (in 1 h 40 min)"
    assert in_words(f"starts {at(t)}", NOW.astimezone(UTC)) == "starts 10:00 UTC (in 1 h 40 min)"


def test_a_reservation_names_its_nodes_and_its_start_reads_as_local_time_not_epoch_seconds():
    start = NOW.timestamp() + 2 * 3600 + 10 * 60
    text = in_words(Reservation("head", start, {"h100-01": 0, "h100-02": 2}).describe(), NOW)
    assert text == "reserved to start at 11:30 CET (in 2 h 10 min) on h100-01, h100-02"
    assert str(int(start)) not in text
    unknown = Reservation("head", None, {"h100-01": 0}).describe()
    assert unknown == "reserved to start when running jobs end on h100-01"


def test_a_reservation_on_no_node_says_it_holds_none_never_an_empty_node_name():
    text = Reservation("head", None, {}).describe()
    assert text == "holds no node: none it may use can take it now"
    assert "''" not in text and not text.endswith("on ")


def test_a_lease_that_ends_before_the_job_would_gives_its_end_date_and_the_need_in_words():
    node = NodeState("rented-01", "c", "A100", "nvlink", (GpuState("g", 0, 81920),),
                     lease_expires_at=datetime(2026, 12, 7, 14, 30, tzinfo=CET).timestamp())
    req = JobRequest("j", 1, expected_runtime_s=40 * 3600)
    reason = lease_covers_runtime(req, node, NOW.timestamp(), FilterSettings())
    assert reason is not None
    assert in_words(reason, NOW) == "lease ends Mon 7 Dec 14:30 CET (in 1 d 5 h), job needs 1 d 16 h"
    gone = lease_covers_runtime(req, node, node.lease_expires_at + 3600, FilterSettings())  # type: ignore[operator]
    assert gone is not None and in_words(gone, NOW).startswith("lease ended Mon 7 Dec 14:30 CET")


def _record(reason: str) -> JobRecord:
    spec = JobSubmitted(job_id="j1", name="x", command=["true"])
    return JobRecord(job_id="j1", state="pending", spec=spec, submitted_at=NOW, reason=reason)


def test_why_is_spoken_at_the_edge_and_its_key_moves_with_the_reason_not_the_clock():
    start = NOW.timestamp() + 3600
    text = why(_record(f"needs 8 GPUs on one node; reserved to start at {at(start)} on h100-01; first in line"))
    early, later = spoken(text, NOW), spoken(text, NOW + timedelta(minutes=30))
    assert "(in 1 h)" in early and "(in 30 min)" in later and "{at:" not in early + later
    assert reason_key(text) == reason_key(why(_record(text.removeprefix("waiting: "))))
    assert reason_key(text) != reason_key(why(_record("needs 8 GPUs on one node; 2 job(s) submitted before it")))


def test_memory_in_words_keeps_what_the_user_asked():
    assert (gb(80 * 1024), gb(79.6 * 1024), gb(H100_MIB), gb(H100_IDLE_MIB)) == ("80", "79.6", "79.65", "79.4")
    assert needs(JobRequest("j", 1, min_memory_mib=79.6 * 1024, gpu_models=("H100",)), False) == (
        "needs 1 GPU with >= 79.6 GB of H100 on one node")


def test_idle_memory_is_the_nameplate_less_what_no_process_holds_and_the_driver_reserve():
    gpu = GpuSample(uuid="g", index=0, model="H100", utilization_gpu_pct=90, memory_used_mib=61000,
                    memory_total_mib=H100_MIB, temperature_c=60,
                    processes=[GpuProcess(pid=1, used_mib=40000, job_id="j"), GpuProcess(pid=2, used_mib=20000)])
    unreported = gpu.model_copy(update={"uuid": "h", "processes": [GpuProcess(pid=3, used_mib=0, job_id="j")]})
    batch = GpuTelemetry(cluster="c", node="n", seq=1, sample_time=NOW, gpus=[gpu, unreported])
    # A GPU whose processes' memory the device did not report says nothing of what it offers idle.
    assert idle_memory(batch) == {"g": H100_MIB - 1000 - DRIVER_RESERVE_MIB}


def _h100(node: str, gpus: int = 8) -> NodeRegistered:
    ids = [GpuIdentity(uuid=f"{node}-{i}", index=i, model="H100", name="NVIDIA H100 80GB HBM3",
                       memory_total_mib=H100_MIB) for i in range(gpus)]
    return NodeRegistered(cluster="c1", node=node, interconnect="nvlink", agent_version="t", gpus=ids)


def _req(**spec: object) -> JobRequest:
    return job_request("j", JobSubmitted(job_id="j", name="x", command=["true"], **spec))  # type: ignore[arg-type]


def test_a_job_above_what_an_idle_card_offers_is_refused_naming_the_largest_node_and_what_it_lacks():
    regs = [_h100("h100-small", 4), _h100("h100-big", 8)]
    idle = {g.uuid: H100_IDLE_MIB for r in regs for g in r.gpus}
    req = _req(gpu_models=["H100"], min_memory_mib=79.6 * 1024)
    assert infeasible_reason(regs, req, Profile()) is None  # by the nameplate (79.65 GB) it would fit
    reason = infeasible_reason(regs, req, Profile(), idle)
    assert reason is not None
    assert reason.startswith("needs 1 GPU with >= 79.6 GB of H100 on one node; no node can ever fit: "
                             "GPU memory below 79.6 GB (79.4 GB free when idle, of 79.65)"), reason
    assert reason.endswith("the largest node, h100-big (8 x H100, 79.4 GB free on an idle GPU), lacks: "
                           "GPU memory below 79.6 GB (79.4 GB free when idle, of 79.65)"), reason
    assert infeasible_reason(regs, _req(gpu_models=["H100"], min_memory_mib=79 * 1024), Profile(), idle) is None


def test_a_job_larger_than_any_node_is_refused_naming_the_largest_node():
    regs = [_h100("h100-small", 4), _h100("h100-big", 8)]
    reason = infeasible_reason(regs, _req(gpus=16, nvlink=True), Profile())
    assert reason is not None and reason.endswith(
        "the largest node, h100-big (8 x H100, 79.65 GB each), lacks: only 8 GPUs per node"), reason


def _node(name: str, idle: float | None) -> NodeState:
    return NodeState(name, "c", "H100", "nvlink",
                     tuple(GpuState(f"{name}-{i}", i, H100_MIB, memory_idle_mib=idle) for i in range(8)))


def test_a_job_that_never_fits_an_idle_card_is_rejected_and_holds_no_reservation_that_delays_others():
    cluster = ClusterState([_node("h100-01", H100_IDLE_MIB)])
    running = RunningJobs()
    busy = JobRequest("busy", 4, gpu_models=("H100",), expected_runtime_s=3600)
    placement = place_on(cluster, busy, WHALEFLUX.profile, 0.0)
    cluster.allocate("busy", placement)  # type: ignore[arg-type]
    running["busy"] = RunningJob("busy", "t", "normal", False, 4, 0.0, 3600.0)
    queue = PendingQueue(WHALEFLUX)
    queue.add(PendingJob(JobRequest("huge", 1, gpu_models=("H100",), min_memory_mib=79.6 * 1024), 0.0, 0))
    queue.add(PendingJob(JobRequest("next", 8, gpu_models=("H100",), expected_runtime_s=600), 1.0, 1))
    queue.add(PendingJob(JobRequest("small", 2, gpu_models=("H100",), expected_runtime_s=600), 2.0, 2))
    reply = schedule(ScheduleRequest(10.0, cluster, queue, running, WHALEFLUX))
    assert "huge" in reply.infeasible and "79.4 GB free when idle" in reply.infeasible["huge"]
    # The next job is the one first in line: the reservation is its, not the impossible job's, and a short job
    # still starts beside it.
    assert reply.reservation is not None and reply.reservation.job_id == "next", reply.waiting
    assert "huge" not in reply.waiting and [s.job.job_id for s in reply.started] == ["small"]


def test_without_telemetry_the_nameplate_decides():
    cluster = ClusterState([_node("h100-01", None)])
    assert isinstance(place_on(cluster, JobRequest("j", 1, min_memory_mib=79.6 * 1024), Profile(), 0.0), Placement)


def test_a_job_the_pass_did_not_reach_that_can_never_fit_says_so_not_that_nothing_is_free():
    cluster = ClusterState([_node("h100-01", H100_IDLE_MIB)])
    text = explain_wait(cluster, JobRequest("j", 1, min_memory_mib=79.6 * 1024), Profile(), 0.0)
    assert text == ("needs 1 GPU with >= 79.6 GB on one node; no node can ever fit: "
                    "GPU memory below 79.6 GB (79.4 GB free when idle, of 79.65) (h100-01)")


def test_a_quarantined_gpu_says_since_when_in_local_time_and_how_long_ago():
    q = GpuQuarantine(cluster="c1", node="h100-01", uuid="u3", index=3, cause="xid", reason="XID 79",
                      since=NOW - timedelta(minutes=20), healthy_since=NOW - timedelta(minutes=5))
    assert spoken(quarantine_line(q), NOW, CET) == (
        "quarantined: h100-01 GPU 3 (xid: XID 79; since 09:00 CET (20 min ago), healthy since 09:15 CET (5 min ago))")


def test_a_gang_larger_than_the_fleet_names_the_largest_node_without_blaming_it():
    reason = infeasible_reason([_h100("h100-a"), _h100("h100-b")], _req(gpus=24), Profile())
    assert reason is not None and "16 GPUs in all" in reason, reason
    assert reason.endswith("the largest node is h100-a (8 x H100, 79.65 GB each)"), reason
