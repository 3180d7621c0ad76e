"""The GPU-holder fold over job.* events (shared.contracts.holders): who holds GPU X, whatever the event order."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from whaleflux.shared.contracts import GpuHolders, Holder, JobHolds
from whaleflux.shared.events import EventData, JobFailed, JobFinished, JobPlaced, JobRequeued, JobStarted

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def placed(job: str, attempt: int, gpus: list[str], rank: int | None = None, node: str = "n1") -> JobPlaced:
    return JobPlaced(job_id=job, attempt=attempt, cluster="c", node=node, gpu_model="H100", gpu_uuids=gpus,
                     gpu_indices=list(range(len(gpus))), command=["true"], team="t", project="p", rank=rank)


def started(job: str, attempt: int, gpus: list[str], s: float = 1, rank: int | None = None) -> JobStarted:
    return JobStarted(job_id=job, attempt=attempt, cluster="c", node="n1", gpu_uuids=gpus, pid=7, started_at=at(s),
                      rank=rank)


def finished(job: str, attempt: int, rank: int | None = None) -> JobFinished:
    return JobFinished(job_id=job, attempt=attempt, cluster="c", node="n1", exit_code=0, started_at=at(1),
                       finished_at=at(9), rank=rank)


def failed(job: str, attempt: int) -> JobFailed:
    return JobFailed(job_id=job, attempt=attempt, cluster="c", node="n1", reason="oom", failed_at=at(9))


def requeued(job: str, attempt: int) -> JobRequeued:
    return JobRequeued(job_id=job, attempt=attempt, cluster="c", node="n1", reason="lost", cause="node_lost")


def fold(events: list[tuple[EventData, float]]) -> GpuHolders:
    holders = GpuHolders()
    for data, s in events:
        holders.apply(data, at(s))
    return holders


def test_a_placement_holds_its_gpus_from_its_time_the_start_keeps_that_and_the_end_releases():
    h = fold([(placed("j", 1, ["g1", "g2"]), 0)])
    assert h.holder("g1") == Holder("j", 1, 0, since=at(0)) and Holder("j", 1, 0, since=at(0)).attempt_key == "j:1"
    h.apply(started("j", 1, ["g1", "g2"], s=2), at(2))
    assert h.holder("g2") == Holder("j", 1, 0, since=at(0), started_at=at(2))
    change = h.apply(finished("j", 1), at(9))
    assert sorted(change.release) == ["g1", "g2"] and h.holders == {}


def test_a_start_seen_without_its_placement_holds_from_the_start_event():
    h = fold([(started("j", 1, ["g1"], s=3), 3)])
    assert h.holder("g1") == Holder("j", 1, 0, since=at(3), started_at=at(3))


def test_an_end_that_arrives_before_its_placement_leaves_nothing_held():
    h = fold([(finished("j", 1), 9), (placed("j", 1, ["g1"]), 0), (started("j", 1, ["g1"]), 1)])
    assert h.holders == {}


def test_an_older_attempts_late_events_never_override_the_newer_attempt():
    h = fold([(placed("j", 2, ["g5"]), 10), (started("j", 1, ["g1"]), 1), (placed("j", 1, ["g1"]), 0)])
    assert h.holder("g1") is None and h.holder("g5") == Holder("j", 2, 0, since=at(10))
    h.apply(finished("j", 1), at(11))  # attempt 1's end says nothing about attempt 2
    assert h.holder("g5") is not None and h.jobs["j"].attempt == 2


def test_a_newer_attempt_releases_what_the_older_one_still_held():
    h = fold([(placed("j", 1, ["g1"]), 0), (started("j", 1, ["g1"]), 1)])
    change = h.apply(placed("j", 2, ["g5"]), at(20))  # attempt 1's node went silent; no end ever came
    assert change.release == ("g1",) and set(h.holders) == {"g5"}


def test_the_next_attempt_on_the_same_gpus_takes_them_over():
    h = fold([(placed("j", 1, ["g1"]), 0), (placed("j", 2, ["g1"]), 20)])
    assert h.holder("g1") == Holder("j", 2, 0, since=at(20))


def test_a_requeue_releases_every_part_of_the_attempt_and_a_late_start_holds_nothing():
    h = fold([(placed("g", 1, ["a0"], rank=0), 0), (placed("g", 1, ["b0", "b1"], rank=1, node="n2"), 0)])
    b1, a0 = h.holder("b1"), h.holder("a0")
    assert b1 is not None and b1.part_key == "g:1#r1" and a0 is not None and a0.part_key == "g:1"
    change = h.apply(requeued("g", 1), at(5))
    assert sorted(change.release) == ["a0", "b0", "b1"] and h.holders == {}
    h.apply(started("g", 1, ["a0"], rank=0), at(6))
    assert h.holders == {}


def test_a_gang_part_that_ends_releases_only_its_own_gpus():
    h = fold([(placed("g", 1, ["a0"], rank=0), 0), (placed("g", 1, ["b0"], rank=1, node="n2"), 0)])
    h.apply(failed("g", 1), at(9))  # rank None: the part on the first node
    assert set(h.holders) == {"b0"}
    h.apply(finished("g", 1, rank=1), at(9))
    assert h.holders == {}


def test_a_later_job_on_the_gpu_keeps_it_when_the_earlier_jobs_end_comes_late():
    h = fold([(placed("a", 1, ["g1"]), 0), (placed("b", 1, ["g1"]), 5), (finished("a", 1), 9)])
    assert h.holder("g1") == Holder("b", 1, 0, since=at(5))


def test_any_order_of_one_attempts_events_ends_with_nothing_held():
    events = [(placed("j", 1, ["g1"]), 0), (started("j", 1, ["g1"]), 1), (finished("j", 1), 9)]
    for order in itertools.permutations(events):
        assert fold(list(order)).holders == {}, order


def test_any_order_of_a_lost_attempt_and_its_successor_ends_with_the_successor_holding_its_gpus():
    events = [(placed("j", 1, ["g1"]), 0), (started("j", 1, ["g1"]), 1), (requeued("j", 1), 5),
              (placed("j", 2, ["g2"]), 6), (started("j", 2, ["g2"], s=7), 7)]
    for order in itertools.permutations(events):
        h = fold(list(order))
        assert set(h.holders) == {"g2"} and h.holders["g2"].attempt == 2, order


def test_holders_and_job_holds_survive_their_store_encoding():
    holder = Holder("j", 3, 1, since=at(0), started_at=at(2))
    assert Holder.decode(holder.encode()) == holder
    assert Holder.decode(Holder("j", 1, 0, since=at(0)).encode()).started_at is None
    job = JobHolds(attempt=3, parts={0: ("a",), 1: ("b", "c")}, ended=frozenset({1}), closed=False)
    assert JobHolds.decode(job.encode()) == job


def test_events_that_hold_nothing_change_nothing():
    h = GpuHolders()
    from whaleflux.shared.events import JobSubmitted
    change = h.apply(JobSubmitted(job_id="j", name="n", command=["true"]), at(0))
    assert not change.changed and h.jobs == {} and h.holders == {}
