"""Noise: an hour of a healthy 256-GPU fleet pages nobody; the same hour with faults pages each fault once.

Drives the pure core of alerting — the rules engine (`rules/engine.py`), the
incident correlator and the route/group dispatcher (`dispatch/`) — with the
simulated GPUs of the agent (`services/agent/simulated.py`, faults from
`faults.py`) under a virtual clock: no NATS, Redis or HTTP, so an hour takes
minutes. The rules, routes and incidents are the shipped `default_rules.yaml`
(or `--rules`).

The fleet is `mixed-256.yaml` (64 RTX 4090, 96 A100, 64 H100, 32 H200) under a
varied job mix: multi-node-sized training jobs at ~95% utilization, fine-tunes,
inference services whose load follows their traffic (25-85%, changing every
few minutes) and short small jobs; GPUs go idle and busy all hour. Samples at
1 Hz per GPU, as the agent sends them.

A *page* is a notification to the on-call receivers (every receiver but
`finops`) that pages: the first that tells of an incident, or an escalation (a
new critical GPU inside an open incident); a *notification* is one message (an
incident that grows sends an update). Each fault lists the GPUs it touches; an
alert on those GPUs (or their node) is attributed to it, anything else is a
false page. The last three faults overlap: GPUs of one pool overheating a minute
apart, in one rack and then in the other, all one incident: each must page.

Alerting's own dispatch (`dispatch/intake.py`: incidents, escalation, groups,
drain requests) and `firing.py` decide, as in the service.

    python bench/alert_noise.py [--minutes 60] [--seed 1] [--only healthy|faults] [--rules FILE]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from whaleflux.agent.faults import Fault
from whaleflux.agent.simulated import SimulatedNode
from whaleflux.alerting.config import DEFAULT_RULES_FILE, load_config
from whaleflux.alerting.dispatch.groups import Notification
from whaleflux.alerting.dispatch.intake import Intake
from whaleflux.alerting.firing import FiringAlerts
from whaleflux.alerting.rules.engine import NodeInfo, RuleEngine, Transition
from whaleflux.shared.catalog import FleetNode, gpu_models, load_fleet
from whaleflux.shared.datafiles import DATA_DIR
from whaleflux.shared.events import GpuTelemetry, NodeDrainRequested

FLEET = DATA_DIR / "fleets" / "mixed-256.yaml"
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
FINOPS = {"finops"}

# class: (weight, GPUs per job (at most the node's), minutes (low, high), utilization % (low, high))
CLASSES = {
    "llm-train": (0.15, (4, 8), (20, 60), (93, 97)),
    "finetune": (0.25, (2, 4), (5, 25), (80, 92)),
    "inference": (0.30, (1, 2), (10, 50), (25, 85)),
    "small": (0.30, (1,), (1, 6), (40, 70)),
}


@dataclass
class Job:
    id: str
    cls: str
    node: str
    uuids: list[str]
    ends_at: float
    util: float
    next_change: float | None = None  # inference: when its traffic changes


@dataclass
class Scenario:
    """One fault: when, what, and the GPUs it touches (node-wide faults touch several)."""

    key: str
    name: str
    at_s: float
    faults: list[Fault] = field(default_factory=list)
    gpus: set[str] = field(default_factory=set)
    node: str = ""


class JobMix:
    """A seeded, varied job mix over the fleet's nodes (no queue: a job that does not fit is dropped)."""

    def __init__(self, nodes: dict[str, SimulatedNode], seed: int) -> None:
        self.nodes = nodes
        self.rng = random.Random(f"jobs:{seed}")
        self.free = {n: [g.uuid for g in sim.identities()] for n, sim in nodes.items()}
        self.jobs: dict[str, Job] = {}
        self.next_arrival = {n: self.rng.expovariate(1 / 60) for n in nodes}
        self.count = 0
        self.started: defaultdict[str, int] = defaultdict(int)
        self.on_submit: Callable[[str, str], object] | None = None
        self.faulted: set[str] = set()

    def _start(self, node: str, t: float, first: bool = False) -> None:
        names = list(CLASSES)
        cls = self.rng.choices(names, weights=[CLASSES[c][0] for c in names])[0]
        _, sizes, (lo, hi), (ulo, uhi) = CLASSES[cls]
        free = self.free[node]
        want = min(self.rng.choice(sizes), len(self.nodes[node].identities()))
        if want > len(free):
            return
        self.count += 1
        uuids = [free.pop(0) for _ in range(want)]
        minutes = self.rng.uniform(lo, hi) * (self.rng.uniform(0.1, 1.0) if first else 1.0)
        job = Job(f"job-{self.count}", cls, node, uuids, t + minutes * 60, self.rng.uniform(ulo, uhi))
        if cls == "inference":
            job.next_change = t + self.rng.uniform(60, 300)
        self.jobs[job.id] = job
        self.nodes[node].job_started(uuids, job.id, pid=10_000 + self.count, util_pct=job.util)
        if self.on_submit is not None:
            self.on_submit(job.id, cls)  # the service learns the class from job.submitted
        self.started[cls] += 1

    def fill(self, fraction: float) -> None:
        """The fleet as it is when the hour starts: about `fraction` of the GPUs busy."""
        for node in self.nodes:
            for _ in range(20):
                total = len(self.nodes[node].identities())
                if len(self.free[node]) <= total * (1 - fraction):
                    break
                self._start(node, 0.0, first=True)

    def step(self, t: float) -> None:
        for job in [j for j in self.jobs.values() if j.ends_at <= t]:
            self.nodes[job.node].job_stopped(job.uuids)
            self.free[job.node].extend(job.uuids)
            del self.jobs[job.id]
        for job in self.jobs.values():
            if job.next_change is not None and job.next_change <= t:
                job.util = min(90.0, max(20.0, job.util + self.rng.uniform(-30, 30)))
                self.nodes[job.node].set_utilization(job.uuids, job.util)
                job.next_change = t + self.rng.uniform(60, 300)
        for node, at in list(self.next_arrival.items()):
            if at <= t:
                self._start(node, t)
                self.next_arrival[node] = t + self.rng.expovariate(1 / 150)

    def drain(self, node: str) -> int:
        """The scheduler drains the node: its jobs stop there (they resume elsewhere), nothing new lands on it."""
        stopped = [j for j in self.jobs.values() if j.node == node]
        for job in stopped:
            self.nodes[node].job_stopped(job.uuids)
            del self.jobs[job.id]
        self.free[node] = []
        self.next_arrival.pop(node, None)
        return len(stopped)

    def busy_gpu(self, node_prefix: str, cls: str | None = None, min_left_s: float = 0,
                 t: float = 0) -> tuple[str, int, str]:
        """(node, GPU index, uuid) of a GPU running a job (of `cls`) with at least `min_left_s` to go,
        on a node no earlier fault used."""
        for job in sorted(self.jobs.values(), key=lambda j: j.id):
            if (job.node.startswith(node_prefix) and (cls is None or job.cls == cls) and job.ends_at - t >= min_left_s
                    and job.node not in self.faulted):
                self.faulted.add(job.node)
                uuid = job.uuids[0]
                index = next(g.index for g in self.nodes[job.node].identities() if g.uuid == uuid)
                return job.node, index, uuid
        raise LookupError(f"no busy GPU on {node_prefix}* ({cls})")


# (key, minute of the hour, what happens); each on its own nodes, spaced so unrelated faults do not overlap.
SCENARIOS = [
    ("cooling-h100", 8, "cooling failure, one GPU (H100, under load)"),
    ("cooling-rack", 14, "rack cooling failure: hot node + throttling neighbours (A100 rack)"),
    ("ecc", 20, "uncorrectable ECC error (H200)"),
    ("xid79", 26, "XID 79, GPU fallen off the bus (A100)"),
    ("leak", 32, "VRAM leak in an inference service (RTX 4090)"),
    ("nvlink-one", 38, "NVLink CRC burst, one GPU (H200)"),
    ("nvlink-node", 44, "NVLink errors on every GPU of a node (A100 baseboard)"),
    ("xid48", 50, "XID 48 double-bit ECC (H100)"),
    ("cooling-4090", 54, "cooling failure, one GPU (RTX 4090, under load)"),
    # Overlapping faults in one incident: every critical alert pages (an escalation), each node is drained.
    ("overlap-1", 55, "overlap 1: cooling failure (RTX 4090, rack 2)"),
    ("overlap-2", 56, "overlap 2: cooling failure on another node of that rack"),
    ("overlap-3", 57, "overlap 3: cooling failure in the pool's other rack"),
]
OVERLAP_RACKS = ("r4090-rack2", "r4090-rack1")


def inject(sc: Scenario, mix: JobMix, nodes: dict[str, SimulatedNode], fleet: dict[str, FleetNode], t: float) -> None:
    """Pick the GPUs for this fault now (a busy one where the fault needs load) and inject it."""
    key = sc.key

    def one(kind: str, prefix: str, cls: str | None = None, min_left: float = 0, **kw) -> None:
        node, index, uuid = mix.busy_gpu(prefix, cls, min_left, t)
        sc.faults.append(Fault(kind=kind, node=node, gpu=index, **kw))
        sc.gpus.add(uuid)
        sc.node = node

    if key == "cooling-h100":
        one("cooling", "h100", "llm-train", 600)
    elif key == "cooling-4090":
        one("cooling", "r4090", "finetune", 300)
    elif key == "cooling-rack":
        node, _, _ = mix.busy_gpu("a100", None, 900, t)
        rack = fleet[node].rack
        for other, fn in fleet.items():
            if fn.rack != rack:
                continue
            factor = 3.0 if other == node else 1.6
            mix.faulted.add(other)
            for g in nodes[other].identities():
                sc.faults.append(Fault(kind="cooling", node=other, gpu=g.index, cooling_factor=factor))
                sc.gpus.add(g.uuid)
        sc.node = node
    elif key == "ecc":
        one("ecc-dbe", "h200")
    elif key == "xid79":
        one("xid79", "a100")
    elif key == "leak":
        one("vram-leak", "r4090", "inference", 900, leak_mib_per_s=24)
    elif key == "nvlink-one":
        one("nvlink-crc", "h200", crc_errors=2000)
    elif key == "nvlink-node":
        node, _, _ = mix.busy_gpu("a100", None, 0, t)
        for g in nodes[node].identities():
            sc.faults.append(Fault(kind="nvlink-crc", node=node, gpu=g.index, crc_errors=800))
            sc.gpus.add(g.uuid)
        sc.node = node
    elif key == "xid48":
        one("xid48", "h100")
    elif key.startswith("overlap-"):
        rack = OVERLAP_RACKS[0] if key != "overlap-3" else OVERLAP_RACKS[1]
        prefixes = [n for n, fn in fleet.items() if fn.rack == rack and n not in mix.faulted]
        # A GPU under a fine-tune (80-92 %) where the rack has one, else any busy one: it heats past slowdown.
        for cls, prefix in [(c, p) for c in ("finetune", None) for p in prefixes]:
            try:
                one("cooling", prefix, cls, 300, cooling_factor=4.0)
                break
            except LookupError:
                continue
    for f in sc.faults:
        nodes[f.node].inject(f)


@dataclass
class Outcome:
    label: str
    samples: int = 0
    raised: int = 0
    raised_at: list = field(default_factory=list)  # virtual seconds since the start of each alert raised
    notifications: list = field(default_factory=list)  # (t, notification) to on-call receivers, firing
    finops: int = 0
    drains: list = field(default_factory=list)  # (t, node, incident)
    incident_of: dict = field(default_factory=lambda: defaultdict(list))  # fingerprint -> incident ids (each firing)
    alert_gpu: dict = field(default_factory=dict)  # fingerprint -> (uuid or "", node)
    raised_by_rule: dict = field(default_factory=lambda: defaultdict(int))
    jobs: dict = field(default_factory=dict)  # jobs started per workload class
    wall_s: float = 0.0


class Core:
    """What the alerting service does with transitions, minus Redis and HTTP (service.py `_apply`, `on_alert`)."""

    def __init__(self, rules: Path, out: Outcome) -> None:
        self.config = load_config(rules)
        self.engine = RuleEngine(self.config, gpu_models())
        self.firing = FiringAlerts("whaleflux/alerting/bench")
        self.intake = Intake(self.config, "whaleflux/alerting/bench")
        self.out = out

    def apply(self, transitions: list[Transition], now: datetime) -> None:
        for tr in transitions:
            change = self.firing.change(tr, now)
            if change is None:
                continue
            self.firing.commit(change)
            changes = self.intake.receive(change.alert, now)
            if change.raised:
                self.raised(tr, now)
            incident = self.intake.correlator.incident_of(tr.fingerprint)
            for d in changes.drains:
                node = NodeDrainRequested.model_validate(d.envelope.data).node
                self.out.drains.append((now, node, incident.id if incident else ""))
            self.notified(changes.notifications, now)

    def raised(self, tr: Transition, now: datetime) -> None:
        incident = self.intake.correlator.incident_of(tr.fingerprint)
        self.out.raised += 1
        self.out.raised_at.append((now - T0).total_seconds())
        self.out.raised_by_rule[tr.rule.name] += 1
        self.out.incident_of[tr.fingerprint].append(incident.id if incident else "")
        self.out.alert_gpu[tr.fingerprint] = (tr.labels.get("UUID", ""), tr.labels.get("Hostname", ""))

    def flush(self, now: datetime) -> None:
        due = self.intake.dispatcher.next_due()
        if due is not None and due <= now:
            self.notified(self.intake.flush(now).notifications, now)

    def notified(self, notifications: list[Notification], now: datetime) -> None:
        for n in notifications:
            if n.receiver in FINOPS:
                self.out.finops += 1
            elif n.status == "firing":
                self.out.notifications.append(((now - T0).total_seconds(), n))


def run(label: str, minutes: float, seed: int, rules: Path, with_faults: bool) -> tuple[Outcome, list[Scenario]]:
    fleet_nodes = {n.name: n for n in load_fleet(FLEET).nodes()}
    models = gpu_models()
    nodes = {
        n.name: SimulatedNode(n.name, models[n.gpu_model], n.gpus, seed=seed, rack=n.rack, interconnect=n.interconnect)
        for n in fleet_nodes.values()
    }
    out = Outcome(label)
    core = Core(rules, out)
    for n in fleet_nodes.values():
        core.engine.observe_node(n.cluster, n.name, NodeInfo(rack=n.rack, pool=n.pool), T0)
    mix = JobMix(nodes, seed)
    mix.on_submit = core.engine.observe_job
    mix.fill(0.6)
    plan = ([Scenario(k, what, minute * 60.0) for k, minute, what in SCENARIOS if minute < minutes]
            if with_faults else [])
    pending = sorted(plan, key=lambda s: s.at_s)
    started = time.perf_counter()
    seq = drained = 0
    for step in range(int(minutes * 60)):
        t = float(step)
        now = T0 + timedelta(seconds=t)
        mix.step(t)
        while pending and pending[0].at_s <= t:
            sc = pending.pop(0)
            inject(sc, mix, nodes, fleet_nodes, t)
        seq += 1
        for name, sim in nodes.items():
            fn = fleet_nodes[name]
            batch = GpuTelemetry(cluster=fn.cluster, node=name, seq=seq, sample_time=now, gpus=sim.sample(now))
            out.samples += len(batch.gpus)
            core.apply(core.engine.observe_telemetry(batch, now), now)
        core.apply(core.engine.tick(now), now)
        core.flush(now)
        # The scheduler acts on node.drain_requested: the node's jobs leave it (see tests/test_auto_drain.py).
        for _, node, _ in out.drains[drained:]:
            mix.drain(node)
        drained = len(out.drains)
    out.wall_s = time.perf_counter() - started
    out.jobs = dict(mix.started)
    return out, plan


def pages_of(out: Outcome) -> tuple[list[tuple[float, str, set[str]]], dict[str, tuple[float, bool]]]:
    """(the pages: (t, incident, fingerprints new in it)), and for each fingerprint its first mention: (t,
    whether that notification paged). A notification pages when it is the first of its incident or an
    escalation."""
    seen: dict[str, set[str]] = defaultdict(set)  # group key -> fingerprints told
    told: set[str] = set()  # incidents paged
    pages: list[tuple[float, str, set[str]]] = []
    first: dict[str, tuple[float, bool]] = {}
    for t, n in out.notifications:
        inc = n.group_labels.get("incident") or next((a.labels.get("incident") for a in n.alerts), n.group_key)
        fps = {a.fingerprint for a in n.alerts if a.status == "firing"}
        new = fps - seen[n.group_key]
        seen[n.group_key] |= fps
        is_page = inc not in told or n.escalation
        told.add(inc)
        if is_page:
            pages.append((t, inc, new))
        for fp in new:
            first.setdefault(fp, (t, is_page))
    return pages, first


def report(out: Outcome, plan: list[Scenario], minutes: float) -> dict:
    """Print pages against faults; return the figures."""
    pages, first = pages_of(out)
    first_page: dict[str, float] = {}  # incident -> its first page
    for t, inc, _ in pages:
        first_page.setdefault(inc, t)
    severity = {a.fingerprint: a.labels.get("severity", "") for _, n in out.notifications for a in n.alerts}
    members: dict[str, set[str]] = defaultdict(set)  # incident -> fingerprints
    for fp, incs in out.incident_of.items():
        for inc in incs:
            members[inc].add(fp)
    print(f"\n== {out.label}: {minutes:g} simulated minutes, {out.samples:,} GPU samples in {out.wall_s:.0f} s wall "
          f"({out.samples / max(out.wall_s, 1e-9):,.0f} samples/s); jobs started {sum(out.jobs.values())} "
          f"{dict(out.jobs)}")
    print(f"alerts raised {out.raised} {dict(out.raised_by_rule)}; pages {len(pages)} (incidents paged "
          f"{len(first_page)}); notifications {len(out.notifications)}; FinOps notifications {out.finops}; "
          f"drain requests {len(out.drains)}")
    claimed: set[str] = set()
    rows = []
    for sc in plan:
        mine = {fp for fp, (uuid, node) in out.alert_gpu.items() if uuid in sc.gpus or (not uuid and node == sc.node)}
        claimed |= mine
        incidents = {inc for fp in mine for inc in out.incident_of[fp]}
        paged = sorted(t for t, _, new in pages if new & mine)
        # Every GPU's first critical alert must page (a new GPU, or one that only warned so far); further
        # critical symptoms of a GPU already paged (XID 48 and its ECC count) are updates.
        first_critical: dict[str, tuple[float, bool]] = {}
        for fp in sorted((fp for fp in mine if severity.get(fp) == "critical" and fp in first), key=lambda f: first[f]):
            first_critical.setdefault(out.alert_gpu[fp][0] or fp, first[fp])
        silent = sorted(gpu for gpu, (_, was_page) in first_critical.items() if not was_page)
        rules = sorted({a.labels["alertname"] for _, n in out.notifications for a in n.alerts if a.fingerprint in mine})
        drains = sorted({node for _, node, inc in out.drains if inc in incidents and node == sc.node})
        one = len(incidents) == 1
        # Paged; or, for a fault that only warned inside an incident already paged, told in an update.
        told = bool(paged) or (bool(mine) and not first_critical and all(fp in first for fp in mine))
        good = told and one and not silent
        latency = paged[0] - sc.at_s if paged else None
        rows.append((sc, good, latency, len(incidents), len(paged)))
        how = (f"paged {latency:.0f} s after" if paged else "only warnings, told in an update" if told
               else "never paged")
        print(f"  [{'ok' if good else 'FAIL'}] {sc.name} at {sc.at_s / 60:.0f} min on {len(sc.gpus)} GPU(s): "
              f"{how} ({len(paged)} page(s)); "
              f"{len(incidents)} incident(s) of {len(mine)} alert(s) {rules}"
              + (f"; drained {', '.join(drains)}" if drains else "")
              + (f"; {len(silent)} GPU(s) turned critical without a page" if silent else ""))
    false_pages = sorted((t, inc) for t, inc, new in pages if not members[inc] & claimed)
    for t, inc in false_pages:
        n = next(n for _, n in out.notifications if (n.group_labels.get("incident") or "") == inc)
        a = n.alerts[0]
        print(f"  false page at {t / 60:.1f} min: {a.labels.get('alertname')} {a.labels.get('Hostname')} "
              f"GPU {a.labels.get('gpu')}: {a.annotations.get('summary')}")
    overlap = [r for r in rows if r[0].key.startswith("overlap-")]
    figures = {"pages": len(pages), "false_pages": len(false_pages), "faults": len(plan),
               "faults_paged": sum(1 for *_, lat, _, _ in rows if lat is not None),
               "one_incident_each": sum(1 for _, good, *_ in rows if good), "notifications": len(out.notifications),
               "overlap_incidents": len({inc for r in overlap for fp in out.alert_gpu
                                         if out.alert_gpu[fp][0] in r[0].gpus for inc in out.incident_of[fp]}),
               "pages_per_fault": {r[0].key: r[4] for r in rows}}
    if plan:
        print(f"faults {figures['faults']}: paged {figures['faults_paged']}, one incident and every critical alert "
              f"paged {figures['one_incident_each']}; pages {figures['pages']}, false pages {figures['false_pages']}"
              + (f"; the {len(overlap)} overlapping faults: {figures['overlap_incidents']} incident(s), pages "
                 f"{[r[4] for r in overlap]}" if overlap else ""))
    else:
        print(f"pages {figures['pages']} (want 0)")
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rules", type=Path, default=DEFAULT_RULES_FILE)
    ap.add_argument("--only", choices=["healthy", "faults"])
    args = ap.parse_args()
    ok = True
    if args.only in (None, "healthy"):
        out, plan = run("healthy fleet", args.minutes, args.seed, args.rules, with_faults=False)
        ok &= report(out, plan, args.minutes)["pages"] == 0
    if args.only in (None, "faults"):
        out, plan = run("same hour with faults", args.minutes, args.seed, args.rules, with_faults=True)
        f = report(out, plan, args.minutes)
        ok &= f["faults"] == f["one_incident_each"] and f["false_pages"] == 0
        ok &= f["overlap_incidents"] <= 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
