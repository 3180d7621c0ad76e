"""Placement core: pure decisions, no I/O."""

from __future__ import annotations

from whaleflux.scheduler.placement import GpuState, Infeasible, JobRequest, NodeState, Placement, Unschedulable, place

GB = 1024


def placed(*args, **kw) -> Placement:
    """`place`, which must have found a placement."""
    decision = place(*args, **kw)
    assert isinstance(decision, Placement), decision
    return decision


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
    decision = placed(JobRequest("j", 1, gpu_models=("A100",)), nodes)
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
    decision = placed(JobRequest("j", 1, min_memory_mib=40 * GB), nodes)
    assert decision.node == "b"


def test_no_nodes_yet_means_wait_not_reject():
    assert isinstance(place(JobRequest("j", 1), []), Unschedulable)


# ---------------------------------------------------------------- the plugin pipeline

from dataclasses import replace  # noqa: E402
from decimal import Decimal  # noqa: E402

from whaleflux.scheduler.placement import ClusterState, ModelFacts, Profile, place_on  # noqa: E402

FACTS = {
    "RTX4090": ModelFacts("RTX4090", {"llm-train": 0.45, "finetune": 0.6, "inference": 0.5, "small": 0.9}),
    "A100": ModelFacts("A100", {"llm-train": 1.0, "finetune": 1.0, "inference": 1.0, "small": 1.0}),
    "H100": ModelFacts("H100", {"llm-train": 2.6, "finetune": 2.2, "inference": 1.6, "small": 1.5}),
}


def test_training_job_goes_to_the_model_that_runs_its_class_fastest():
    nodes = [node("a100", model="A100"), node("h100", model="H100")]
    decision = placed(JobRequest("j", 1, workload_class="llm-train"), nodes, facts=FACTS)
    assert decision.node == "h100" and decision.speed == 2.6


def test_short_small_job_takes_the_gpu_it_gains_most_on_and_leaves_h100_to_training():
    nodes = [node("r", model="RTX4090", gpus=4, mem=24 * GB), node("h100", model="H100")]
    short = JobRequest("j", 1, workload_class="small", min_memory_mib=10 * GB, expected_runtime_s=300)
    assert placed(short, nodes, facts=FACTS).node == "r"
    # A day-long training job wants the fastest GPU it can get.
    long = JobRequest("k", 1, workload_class="llm-train", expected_runtime_s=86400)
    assert placed(long, [node("a100", model="A100"), node("h100", model="H100")], facts=FACTS).node == "h100"


def test_unhealthy_nodes_are_skipped_and_named_in_the_reason():
    from dataclasses import replace

    base = node("ok", taken=(0, 1, 2, 3, 4, 5, 6, 7))
    nodes = [
        base,
        replace(node("c"), cordoned=True),
        replace(node("d"), draining=True),
        replace(node("hot"), temperature_c=90, thermal_limit_c=87),
        replace(node("xid"), last_critical_xid_at=900.0),
    ]
    decision = place(JobRequest("j", 1), nodes, now=1000.0)
    assert isinstance(decision, Unschedulable)
    for word in ("cordoned (c)", "draining (d)", "thermal limit 87 C (hot)", "critical XID 100 s ago (xid)"):
        assert word in decision.reason
    later = placed(JobRequest("j", 1), nodes, now=2000.0)  # the XID is older than the quarantine
    assert later.node == "xid"


def test_pool_constraint_and_a_pool_that_does_not_exist():
    from dataclasses import replace

    nodes = [replace(node("cloud1"), pool="cloud"), replace(node("prem1"), pool="onprem")]
    assert placed(JobRequest("j", 1, pool="onprem"), nodes).node == "prem1"
    nowhere = place(JobRequest("j", 1, pool="secret"), nodes)
    assert isinstance(nowhere, Infeasible) and "pool" in nowhere.reason


def test_leased_node_is_used_only_if_the_lease_outlives_the_job():
    from dataclasses import replace

    leased = replace(node("leased"), lease_expires_at=3600.0)
    owned = node("owned", taken=(0, 1, 2, 3, 4, 5))
    short = placed(JobRequest("j", 1, expected_runtime_s=600), [leased, owned])
    long = placed(JobRequest("j", 1, expected_runtime_s=7200), [leased, owned])
    assert short.node == "owned"  # best fit still wins among nodes that pass
    lone = place(JobRequest("j", 1, expected_runtime_s=7200), [leased])
    assert isinstance(lone, Unschedulable) and "lease ends {at:3600}, job needs 2 h" in lone.reason
    assert long.node == "owned"


def test_gang_job_larger_than_a_node_spans_nodes_all_or_nothing():
    nodes = [node("a", model="H100"), node("b", model="H100"), node("c", model="A100", taken=(0, 1, 2, 3))]
    gang = place(JobRequest("j", 16, workload_class="llm-train", allow_multi_node=True), nodes, facts=FACTS)
    assert isinstance(gang, Placement) and gang.gpu_count == 16
    assert {s.node for s in gang.shares} == {"a", "b"}
    assert gang.speed == 2.6 * 1.0 * 0.9  # one model, NVLink inside, cross-node
    too_big = place(JobRequest("j", 24, allow_multi_node=True), nodes)
    assert isinstance(too_big, Unschedulable) and "20 usable GPU(s) free" in too_big.reason
    never = place(JobRequest("j", 32, allow_multi_node=True), nodes)
    assert isinstance(never, Infeasible) and "24 GPUs in all" in never.reason


def test_replicas_of_an_inference_service_spread_across_nodes():
    cluster = ClusterState([node("a"), node("b"), node("c")], FACTS)
    seen = set()
    for i in range(3):
        d = place_on(cluster, JobRequest(f"r{i}", 1, workload_class="inference", service="chat"), Profile(), 0.0)
        assert isinstance(d, Placement)
        cluster.allocate(f"r{i}", d, service="chat")
        seen.add(d.node)
    assert seen == {"a", "b", "c"}


def test_cheaper_work_wins_when_speed_is_equal():
    facts = {"A100": ModelFacts("A100", {"small": 1.0}, Decimal("1.00")),
             "H100": ModelFacts("H100", {"small": 1.0}, Decimal("3.00"))}
    nodes = [node("h", model="H100"), node("a", model="A100")]
    assert placed(JobRequest("j", 1), nodes, profile=Profile(weights={"cost": 1.0}), facts=facts).node == "a"


def test_wait_reason_names_the_need_and_the_largest_free_block():
    nodes = [node("h100-01", taken=(0, 1, 2, 3, 4, 5, 6)), node("h100-02", taken=(0, 1, 2, 3, 4))]
    decision = place(JobRequest("j", 4, min_memory_mib=80 * GB), nodes)
    assert isinstance(decision, Unschedulable)
    assert decision.reason == "needs 4 GPUs with >= 80 GB on one node; largest free block is 3 on h100-02"


def test_job_that_fits_80_gb_leaves_the_141_gb_gpus_to_jobs_only_they_can_hold():
    facts = {**FACTS, "H200": ModelFacts("H200", {"llm-train": 3.0, "finetune": 2.5, "inference": 2.3, "small": 1.5})}
    nodes = [node("h200", model="H200", mem=141 * GB), node("h100", model="H100")]
    # An hour of fine-tuning: an H200 is only 14% faster than an H100, and jobs above 80 GB need it.
    fits_80 = JobRequest("j", 1, workload_class="finetune", min_memory_mib=40 * GB, expected_runtime_s=3600)
    assert placed(fits_80, nodes, facts=facts).node == "h100"
    no_spare = Profile(weights={**Profile().weights, "spare_largest_memory": 0.0})
    assert placed(fits_80, nodes, no_spare, facts=facts).node == "h200"
    # A job that needs the memory is not penalized, and a full H100 does not stop the 80 GB job.
    assert placed(replace(fits_80, min_memory_mib=100 * GB), nodes, facts=facts).node == "h200"
    assert placed(fits_80, [nodes[0], node("h100", model="H100", taken=range(8))], facts=facts).node == "h200"



def test_with_the_largest_memory_gpus_all_taken_an_h100_is_not_spared_for_a_job_that_fits_a_24_gb_card():
    facts = {"H100": ModelFacts("H100", {"small": 1.5}), "H200": ModelFacts("H200", {"small": 1.5}),
             "RTX4090": ModelFacts("RTX4090", {"small": 0.9})}
    profile = Profile(weights={"speed": 1.0, "spare_largest_memory": 5.0})
    job = JobRequest("j", 1, workload_class="small", min_memory_mib=5 * GB)
    h200 = node("h200", model="H200", mem=141 * GB, taken=range(8))
    others = [node("h100", model="H100"), node("4090", model="RTX4090", mem=24 * GB)]
    # The H200s are the fleet's largest-memory GPUs: only they are spared, so the job takes the faster H100.
    assert placed(job, [h200, *others], profile, facts=facts).node == "h100"
    # A free H200 is still spared, for the H100 as for the 24 GB card.
    free_h200 = node("h200", model="H200", mem=141 * GB)
    assert placed(job, [free_h200, *others], profile, facts=facts).node == "h100"
    assert placed(job, [free_h200, others[1]], profile, facts=facts).node == "4090"

def test_a_dynamic_filter_without_a_may_reject_entry_is_asked_about_every_node(monkeypatch):
    """Healthy nodes skip the built-in dynamic filters (filters.MAY_REJECT); a filter that names no such
    predicate is still asked about each node, so a new filter is never skipped by that shortcut."""
    from dataclasses import replace

    from whaleflux.scheduler.placement import ClusterState, place_on
    from whaleflux.scheduler.placement import filters as F
    from whaleflux.scheduler.placement.framework import Profile, explain_wait

    asked: list[str] = []

    def not_b(req, n, now, settings):
        asked.append(n.name)
        return "b is out" if n.name == "b" else None

    monkeypatch.setitem(F.DYNAMIC_FILTERS, "not_b", not_b)
    profile = replace(Profile(), dynamic_filters=(*Profile().dynamic_filters, "not_b"))
    cluster = ClusterState([node("a", taken=range(7)), node("b")])
    decision = place_on(cluster, JobRequest("j", 2), profile, 0.0)
    assert isinstance(decision, Unschedulable) and "b is out (b)" in decision.reason
    assert "largest free block is 1 on a" in decision.reason
    assert "b" in asked
    # The built-in filters alone: b (healthy) is used.
    healthy = place_on(cluster, JobRequest("j", 2), Profile(), 0.0)
    assert isinstance(healthy, Placement) and healthy.node == "b"
    cordoned = ClusterState([node("a", taken=range(7)), replace(node("b"), cordoned=True)])
    assert "unavailable: cordoned (b)" in explain_wait(cordoned, JobRequest("j", 2), Profile(), 0.0)


def test_cluster_state_knows_the_jobs_on_each_node_and_the_nodes_with_free_gpus():
    from whaleflux.scheduler.placement import ClusterState, place_on
    from whaleflux.scheduler.placement.framework import Profile, eligible

    cluster = ClusterState([node("a", taken=(0,)), node("b", taken=range(8)), node("c", gpus=4)])
    assert cluster.jobs_on == {"a": {"other": None}, "b": {"other": None}, "c": {}}
    view = eligible(cluster, JobRequest("j", 1), Profile())
    assert cluster.with_free(view) == ["a", "c"]
    p = place_on(cluster, JobRequest("j", 4), Profile(), 0.0)
    assert isinstance(p, Placement) and p.node == "c"
    cluster.allocate("j", p)
    assert cluster.jobs_on["c"] == {"j": None} and cluster.with_free(view) == ["a"]
    cluster.release("j")
    assert cluster.jobs_on["c"] == {} and cluster.with_free(view) == ["a", "c"]
