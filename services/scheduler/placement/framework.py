"""The placement pipeline: static filters -> dynamic filters -> score -> select.

`place_on(cluster, req, profile, now)` decides for one job against the
indexed cluster; `place(req, nodes)` does the same on a plain list of nodes.
Both return a `Placement`, `Unschedulable` (wait: could run once GPUs free
up) or `Infeasible` (can never run on this fleet), each with a reason a user
can read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from . import filters as F
from . import scorers as S
from .cluster import ClusterState, StaticView
from .model import Decision, Infeasible, JobRequest, ModelFacts, NodeShare, NodeState, Placement, Unschedulable


@dataclass(frozen=True)
class Profile:
    """A placement policy as configuration: which plugins run, and score weights."""

    name: str = "whaleflux"
    static_filters: tuple[str, ...] = tuple(F.STATIC_FILTERS)
    dynamic_filters: tuple[str, ...] = tuple(F.DYNAMIC_FILTERS)
    weights: Mapping[str, float] = field(
        default_factory=lambda: {
            "speed": 6.0, "comparative_advantage": 2.0, "best_fit": 2.0, "nvlink_locality": 2.0,
            "cost": 1.0, "spread_replicas": 2.0, "spare_largest_memory": 5.0,
        }
    )
    # How many of the tightest-fitting nodes per model are scored (best fit walks buckets upward).
    candidates_per_model: int = 8
    # Model-unaware first fit in fleet order (the baselines), instead of scoring.
    first_fit: bool = False
    xid_quarantine_s: float = 600.0
    # A job that fits one node but finds no node free enough may span nodes (when it
    # allows that) if it then still runs at least this fraction of its best speed.
    split_min_speed_ratio: float | None = 0.5


FIRST_FIT = Profile(name="first-fit", weights={"first_fit": 1.0}, first_fit=True, split_min_speed_ratio=None)


def place(
    req: JobRequest,
    nodes: list[NodeState],
    profile: Profile | None = None,
    facts: Mapping[str, ModelFacts] | None = None,
    now: float = 0.0,
) -> Decision:
    """Pick GPUs for one job on a snapshot of nodes."""
    if not nodes:
        return Unschedulable("no GPU nodes registered yet")
    return place_on(ClusterState(nodes, facts), req, profile or Profile(), now)


# What `place_on` answers when every node it would choose among is one the caller refuses (none scored).
REFUSED = Unschedulable("every candidate node refused")


def place_on(
    cluster: ClusterState,
    req: JobRequest,
    profile: Profile,
    now: float,
    caps: Mapping[str, int] | None = None,
    refused: Callable[[str], bool] | None = None,
) -> Decision:
    """Pick GPUs for one job; `caps` limits how many GPUs given nodes may give (0 = none). With `refused` (the
    nodes on which the caller would refuse a one-node placement), `REFUSED` when the pick would be on one."""
    if not cluster.nodes:
        return Unschedulable("no GPU nodes registered yet")
    view = eligible(cluster, req, profile)
    if not view.nodes:
        return Infeasible(f"{F.needs(req, req.allow_multi_node)}; no node can ever fit: {F.summary(view.rejections)}")
    settings = F.FilterSettings(profile.xid_quarantine_s, cluster.speed)
    if req.gpus > view.max_gpus_per_node:
        if view.total_gpus < req.gpus:
            return Infeasible(
                f"{F.needs(req, req.allow_multi_node)}; the nodes it may use have {view.total_gpus} GPUs in all,"
                f" only {view.max_gpus_per_node} GPUs per node"
            )
        (cl, pool), largest = max(_group_sizes(cluster, view).items(), key=lambda kv: kv[1])
        if largest < req.gpus:
            return Infeasible(
                f"{F.needs(req, req.allow_multi_node)}; a gang stays within one cluster and pool, and the largest it"
                f" may use ({cl}/{pool}) has {largest} GPUs"
            )
        return _place_gang(cluster, req, profile, now, view, settings, caps)
    if profile.first_fit:
        found = _first_fit(cluster, req, profile, now, view, settings, caps)
        if found:
            return REFUSED if refused is not None and refused(found.node) else found
    else:
        cands = _candidates(cluster, req, profile, now, view, settings, caps)
        if cands:
            if refused is not None and all(refused(c.node.name) for c in cands):
                return REFUSED
            return _select(cluster, req, profile, cands)
        if req.allow_multi_node and req.gpus > 1 and profile.split_min_speed_ratio is not None:
            split = _place_gang(cluster, req, profile, now, view, settings, caps)
            best = max(S.candidate_speed(cluster, req, cluster.nodes[n]) for n in view.nodes)
            if isinstance(split, Placement) and split.speed >= profile.split_min_speed_ratio * best:
                return split
    return Unschedulable(explain_wait(cluster, req, profile, now, caps))


def eligibility(req: JobRequest) -> tuple[object, ...]:
    """What the static filters read of the request: requests alike in it have the same eligible nodes.
    (Not kept on the request: an attribute added after `__init__` slows every attribute read of it.)"""
    return (req.gpu_models, req.min_memory_mib, req.pool, req.labels, req.allow_multi_node or req.gpus, req.nvlink)


def eligible(cluster: ClusterState, req: JobRequest, profile: Profile) -> StaticView:
    """Nodes that pass the static filters for this job (cached per shape)."""
    key = (*eligibility(req), profile.static_filters)
    known = cluster.views.get(key)
    if known is not None:
        return known

    def build() -> StaticView:
        if req.gpu_models and "model_allowed" in profile.static_filters:
            # The view without the model list, narrowed to those models (moves and `off_largest` ask for
            # many model lists): the same nodes. An empty one is built in full, for its rejections.
            allowed = set(req.gpu_models)
            wider = eligible(cluster, replace(req, gpu_models=()), profile)
            narrowed = [n for n in wider.nodes if cluster.nodes[n].model in allowed]
            if narrowed:
                return StaticView.of(cluster.nodes, narrowed, {})
        checks = [F.STATIC_FILTERS[n] for n in profile.static_filters]
        names: list[str] = []
        rejections: dict[str, list[str]] = {}
        for name, node in cluster.nodes.items():
            reason = next((r for r in (c(req, node) for c in checks) if r), None)
            if reason:
                rejections.setdefault(reason, []).append(name)
                continue
            names.append(name)
        return StaticView.of(cluster.nodes, names, rejections)

    return cluster.static_view(key, build)


def unavailable(cluster: ClusterState, req: JobRequest, node: NodeState, profile: Profile, now: float) -> str | None:
    """Why the node cannot take the job now (dynamic filters), or None."""
    flagged = _flagged(cluster, profile)
    if flagged is not None and node.name not in flagged:
        return None
    return _dynamic_reason(req, node, now, profile, F.FilterSettings(profile.xid_quarantine_s, cluster.speed))


def available(cluster: ClusterState, req: JobRequest, names: Iterable[str], profile: Profile, now: float) -> list[str]:
    """Those of `names` (in their order) whose nodes can take the job now (`unavailable` says None), the dynamic
    filters asked only of the nodes they may reject."""
    flagged = _flagged(cluster, profile)
    if flagged is not None and not flagged:
        return list(names)
    settings = F.FilterSettings(profile.xid_quarantine_s, cluster.speed)
    nodes = cluster.nodes
    return [n for n in names if (flagged is not None and n not in flagged)
            or not _dynamic_reason(req, nodes[n], now, profile, settings)]


def usable(cluster: ClusterState, req: JobRequest, node: str) -> list[int]:
    """The node's free GPUs that have enough memory for the job."""
    return _usable(cluster, req, node, None)


def may_be_unavailable(cluster: ClusterState, profile: Profile) -> dict[str, None] | None:
    """The nodes `unavailable` may reject (fleet order); None: any node. It passes every other node."""
    return _flagged(cluster, profile)


def _flagged(cluster: ClusterState, profile: Profile) -> dict[str, None] | None:
    """The nodes (fleet order) some dynamic filter of the profile may reject; None: any node may be rejected.

    The others pass every dynamic filter whatever `now` is, so they are never asked (`filters.MAY_REJECT`)."""

    def build() -> dict[str, None] | None:
        guards = [F.MAY_REJECT.get(name) for name in profile.dynamic_filters]
        checks = [g for g in guards if g is not None]
        if len(checks) < len(guards):
            return None
        return {name: None for name, node in cluster.nodes.items() if any(g(node) for g in checks)}

    return cluster.derived(("flagged", profile.dynamic_filters), build)


def _dynamic_reason(
    req: JobRequest, node: NodeState, now: float, profile: Profile, settings: F.FilterSettings
) -> str | None:
    for name in profile.dynamic_filters:
        reason = F.DYNAMIC_FILTERS[name](req, node, now, settings)
        if reason:
            return reason
    return None


def _usable(cluster: ClusterState, req: JobRequest, name: str, caps: Mapping[str, int] | None) -> list[int]:
    free = cluster.free[name]
    if not free or req.min_memory_mib <= cluster.memory_floor[name]:
        usable = free  # (none free; or every GPU has that much, and none is measured: usable_gpus says the same)
    else:
        usable = F.usable_gpus(req, cluster.gpus[name], free)
    if caps is not None and name in caps:
        usable = usable[: caps[name]]
    return usable


def _first_fit(
    cluster: ClusterState, req: JobRequest, profile: Profile, now: float, view: StaticView,
    settings: F.FilterSettings, caps: Mapping[str, int] | None,
) -> Placement | None:
    flagged = _flagged(cluster, profile)
    for name in view.nodes:
        if len(cluster.free[name]) < req.gpus:
            continue
        node = cluster.nodes[name]
        if (flagged is None or name in flagged) and _dynamic_reason(req, node, now, profile, settings):
            continue
        usable = _usable(cluster, req, name, caps)
        if len(usable) >= req.gpus:
            chosen = tuple(usable[: req.gpus])
            speed = S.candidate_speed(cluster, req, node)
            return _single(node, chosen, speed, f"first fit on {name}")
    return None


def _candidates(
    cluster: ClusterState, req: JobRequest, profile: Profile, now: float, view: StaticView,
    settings: F.FilterSettings, caps: Mapping[str, int] | None,
) -> list[S.Candidate]:
    out: list[S.Candidate] = []
    flagged = _flagged(cluster, profile)
    for model in view.models:
        buckets = cluster.buckets[model]
        found = 0
        for count in range(req.gpus, len(buckets)):
            for name in buckets[count]:
                if name not in view.members:
                    continue
                node = cluster.nodes[name]
                if (flagged is None or name in flagged) and _dynamic_reason(req, node, now, profile, settings):
                    continue
                usable = _usable(cluster, req, name, caps)
                if len(usable) < req.gpus:
                    continue
                speed = S.candidate_speed(cluster, req, node)
                out.append(S.Candidate(node, tuple(usable[: req.gpus]), len(usable) - req.gpus, speed))
                found += 1
                if found >= profile.candidates_per_model:
                    break
            if found >= profile.candidates_per_model:
                break
    return out


def _select(cluster: ClusterState, req: JobRequest, profile: Profile, cands: list[S.Candidate]) -> Placement:
    values = [v for v in (S.work_per_usd(cluster, c) for c in cands) if v is not None]
    mems = [cluster.memory[c.node.name] for c in cands]
    ctx = S.ScoreContext(
        cluster,
        max(c.speed for c in cands),
        max(values) if values else None,
        max(S.advantage(cluster, req, c.node) for c in cands),
        min(mems) or 1.0,
        max(mems) or 1.0,
        max((m for m in mems if m < max(mems)), default=max(mems)) or 1.0,
        cluster.derived(("largest memory",), lambda: max(cluster.memory.values(), default=1.0)),
    )
    total_weight = sum(profile.weights.values()) or 1.0
    scorers = [(S.SCORERS[n], w) for n, w in profile.weights.items()]

    def total(c: S.Candidate) -> float:
        return sum(w * score(req, c, ctx) for score, w in scorers) / total_weight

    score, _, i = max((total(c), -cluster.order[c.node.name], i) for i, c in enumerate(cands))
    best = cands[i]
    why = (
        f"{best.node.name} ({best.node.model}): speed {best.speed:.2f}x, "
        f"{best.leftover} GPU(s) left free, score {score:.0f} of {len(cands)} candidate(s)"
    )
    return _single(best.node, best.gpus, best.speed, why)


def _single(node: NodeState, chosen: tuple[int, ...], speed: float, why: str) -> Placement:
    uuids = tuple(next(g.uuid for g in node.gpus if g.index == i) for i in chosen)
    return Placement(node.name, node.cluster, node.model, uuids, chosen, speed=speed, explanation=why)


def _group_sizes(cluster: ClusterState, view: StaticView) -> dict[tuple[str, str], int]:
    """GPUs of the view's nodes per cluster and pool (computed once per view)."""

    def build() -> dict[tuple[str, str], int]:
        sizes: dict[tuple[str, str], int] = {}
        for name in view.nodes:
            node = cluster.nodes[name]
            sizes[gang_group(node)] = sizes.get(gang_group(node), 0) + len(node.gpus)
        return sizes

    return cluster.derived(("group sizes", id(view)), build)


def gang_group(node: NodeState) -> tuple[str, str]:
    """What a gang stays within: a cluster (its network) and a pool (whose GPUs, at what price)."""
    return node.cluster, node.pool or "default"


def _place_gang(
    cluster: ClusterState, req: JobRequest, profile: Profile, now: float, view: StaticView,
    settings: F.FilterSettings, caps: Mapping[str, int] | None,
) -> Decision:
    """All or nothing across nodes of one cluster and pool, for a job larger than any node."""
    groups: dict[tuple[str, str], list[tuple[NodeState, list[int]]]] = {}
    flagged = _flagged(cluster, profile)
    for name in cluster.with_free(view):
        node = cluster.nodes[name]
        if (flagged is None or name in flagged) and _dynamic_reason(req, node, now, profile, settings):
            continue
        usable = _usable(cluster, req, name, caps)
        if usable:
            groups.setdefault(gang_group(node), []).append((node, usable))
    fits = {g: pools for g, pools in groups.items() if sum(len(u) for _, u in pools) >= req.gpus}
    if not fits:
        most = max((sum(len(u) for _, u in pools) for pools in groups.values()), default=0)
        return Unschedulable(f"{F.needs(req, True)}; at most {most} usable GPU(s) free in one cluster and pool")
    if profile.first_fit:
        first = min(fits, key=lambda g: min(cluster.order[n.name] for n, _ in fits[g]))
        return _gang(cluster, req, fits[first], f"first fit across nodes of {first[0]}/{first[1]}")
    # Within each cluster and pool, prefer one model (the slowest GPU sets the pace), fastest first,
    # fewest nodes; then the group whose gang runs fastest, one model before a mix.
    options = []
    for (cl, pool), pools in fits.items():
        by_model: dict[str, list[tuple[NodeState, list[int]]]] = {}
        for node, usable in pools:
            by_model.setdefault(node.model, []).append((node, usable))
        fitting = [m for m, ps in by_model.items() if sum(len(u) for _, u in ps) >= req.gpus]
        if fitting:
            model = max(fitting, key=lambda m: cluster.speed(m, req.workload_class))
            chosen = sorted(by_model[model], key=lambda p: (-len(p[1]), cluster.order[p[0].name]))
            placement = _gang(cluster, req, chosen, f"gang on {model} nodes of {cl}/{pool}")
        else:
            chosen = sorted(pools, key=lambda p: (-cluster.speed(p[0].model, req.workload_class), -len(p[1]),
                                                  cluster.order[p[0].name]))
            why = f"gang across models of {cl}/{pool} (no single model has enough free)"
            placement = _gang(cluster, req, chosen, why)
        options.append(
            (bool(fitting), placement.speed, -len(placement.shares), -cluster.order[placement.node], placement)
        )
    return max(options, key=lambda o: o[:4])[-1]


def _gang(cluster: ClusterState, req: JobRequest, pools: list[tuple[NodeState, list[int]]], why: str) -> Placement:
    shares: list[NodeShare] = []
    left = req.gpus
    for node, usable in pools:
        if left <= 0:
            break
        take = tuple(usable[:left])
        left -= len(take)
        uuids = tuple(cluster.gpus[node.name][i].uuid for i in take)
        shares.append(NodeShare(node.name, node.cluster, node.model, uuids, take))
    nodes = [cluster.nodes[s.node] for s in shares]
    slowest = min(cluster.speed(n.model, req.workload_class) for n in nodes)
    inside = min(cluster.interconnects.for_node(n.interconnect) for n in nodes)
    speed = slowest * inside * (cluster.interconnects.cross_node if len(shares) > 1 else 1.0)
    first = shares[0]
    return Placement(
        first.node, first.cluster, first.model, first.gpu_uuids, first.gpu_indices,
        others=tuple(shares[1:]), speed=speed, explanation=f"{why}: {len(shares)} node(s), speed {speed:.2f}x",
    )


def explain_wait(
    cluster: ClusterState, req: JobRequest, profile: Profile, now: float, caps: Mapping[str, int] | None = None
) -> str:
    """Why a feasible job cannot start now: its needs, the largest free block, what ruled nodes out."""
    view = eligible(cluster, req, profile)
    if not view.nodes:  # (a pass that reaches it rejects it)
        return f"{F.needs(req, req.allow_multi_node)}; no node can ever fit: {F.summary(view.rejections)}"
    settings = F.FilterSettings(profile.xid_quarantine_s, cluster.speed)
    unhealthy: dict[str, list[str]] = {}
    flagged = _flagged(cluster, profile)
    ruled_out: set[str] = set()
    for name in view.nodes if flagged is None else [n for n in flagged if n in view.members]:
        reason = _dynamic_reason(req, cluster.nodes[name], now, profile, settings)
        if reason:
            unhealthy.setdefault(reason, []).append(name)
            ruled_out.add(name)
    best, best_node = 0, None
    held: dict[str, int] = {}
    # Only nodes with a free GPU can hold a block or memory held elsewhere: few on a busy fleet.
    for name in cluster.with_free(view):
        if name in ruled_out:
            continue
        usable = _usable(cluster, req, name, caps)
        # Free by our bookkeeping, but telemetry says something else holds the memory.
        short = sum(1 for i in cluster.free[name] if i not in usable and F.held_elsewhere(req, cluster.gpus[name][i]))
        if short:
            held[name] = short
        if len(usable) > best:
            best, best_node = len(usable), name
    gang = req.allow_multi_node and req.gpus > view.max_gpus_per_node
    block = f"largest free block is {best} on {best_node}" if best_node else "no usable GPU free"
    text = f"{F.needs(req, gang)}; {block}"
    if held:
        where = ", ".join(f"{n} on {name}" for name, n in sorted(held.items()))
        text += f"; free GPU(s) whose memory is held by processes WhaleFlux did not start: {where}"
    if unhealthy:
        text += f"; unavailable: {F.summary(unhealthy)}"
    return text
