"""Placement core: pure decisions, no I/O."""

from __future__ import annotations

from whaleflux.scheduler.placement import GpuState, Infeasible, JobRequest, NodeState, Placement, Unschedulable, place

GB = 1024


def node(name, model="H100", gpus=8, mem=80 * GB, taken=(), free_mem=None):
    return NodeState(
        name=name, cluster="c", model=model, interconnect="nvlink",
        gpus=tuple(
            GpuState(f"{name}-g{i}", i, mem, free_mem, "other" if i in taken else None) for i in range(gpus)
        ),
    )


def test_best_fit_prefers_the_node_left_with_fewest_free_gpus():
    nodes = [node("a", taken=()), node("b", taken=(0, 1, 2, 3, 4, 5))]
    decision = place(JobRequest("j", 2), nodes)
    assert isinstance(decision, Placement)
    assert decision.node == "b" and decision.gpu_indices == (6, 7)


def test_allowed_models_filter_nodes():
    nodes = [node("a100", model="A100"), node("h100", model="H100")]
    decision = place(JobRequest("j", 1, gpu_models=("A100",)), nodes)
    assert decision.node == "a100"


def test_job_that_can_never_fit_is_infeasible_with_a_reason():
    nodes = [node("a", gpus=8), node("r", model="RTX4090", gpus=4, mem=24 * GB)]
    too_many = place(JobRequest("j", 16), nodes)
    assert isinstance(too_many, Infeasible) and "16 GPU" in too_many.reason
    wrong_model = place(JobRequest("j", 1, gpu_models=("B200",)), nodes)
    assert isinstance(wrong_model, Infeasible) and "not allowed" in wrong_model.reason
    too_big = place(JobRequest("j", 1, min_memory_mib=200 * GB), nodes)
    assert isinstance(too_big, Infeasible) and "memory" in too_big.reason


def test_busy_fleet_is_unschedulable_not_infeasible():
    decision = place(JobRequest("j", 4), [node("a", taken=(0, 1, 2, 3, 4))])
    assert isinstance(decision, Unschedulable)
    assert decision.reason == "needs 4 GPUs on one node; largest free block is 3 on a"


def test_memory_held_by_a_foreign_process_counts_against_the_gpu():
    # Bookkeeping says free, telemetry says only 10 GB free: a 40 GB job must not go there.
    nodes = [node("a", gpus=1, free_mem=10 * GB), node("b", gpus=2)]
    decision = place(JobRequest("j", 1, min_memory_mib=40 * GB), nodes)
    assert decision.node == "b"


def test_no_nodes_yet_means_wait_not_reject():
    assert isinstance(place(JobRequest("j", 1), []), Unschedulable)
