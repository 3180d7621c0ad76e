"""Rule evaluation: samples, heartbeats, events and findings in, firing/resolved transitions out.

No I/O; time passed in.

Each rule kind decides, per series (one GPU, node or event key), whether its
condition holds (FIRE), clearly does not (CLEAR), or sits in between (HOLD:
inside a hysteresis band, or waiting out `clear_after`) — `conditions.py`,
`baseline.py`. The engine adds the shared parts: `for` durations (a condition
must hold that long before firing), one alert per series, and a stable
fingerprint from identity labels.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, get_args

from whaleflux.shared.catalog import GpuModel, model_key
from whaleflux.shared.contracts import Finding
from whaleflux.shared.events import EventData, GpuSample, GpuTelemetry

from ..config import AlertingConfig, BaselineRule, EventRule, FindingRule, HeartbeatRule, Rule, RuleBase
from . import findings as finding_rules
from .baseline import Baselines
from .conditions import SampleRule, evaluate
from .jobs import failure_fields
from .series import Cond, NodeInfo, RemovedRule, Series, Transition, Verdict, fingerprint, render
from .workload import JOB_CLASS_KEEP, WorkloadClasses

__all__ = ["NodeInfo", "RuleEngine", "Transition"]

FINGERPRINT_CACHE = 500_000
GpuRule = SampleRule | BaselineRule
GPU_KINDS = (*get_args(SampleRule), BaselineRule)


class RuleEngine:
    def __init__(self, config: AlertingConfig, models: dict[str, GpuModel]):
        self.models = models
        self.series: dict[str, Series] = {}
        self.rule_of: dict[str, str] = {}  # fingerprint -> rule name
        self.nodes: dict[tuple[str, str], NodeInfo] = {}
        self.last_seen: dict[tuple[str, str], float] = {}
        self.baselines = Baselines()
        self.workloads = WorkloadClasses()
        self.owners: dict[str, tuple[str, str]] = {}  # job id -> (team, project), from job.submitted
        self._fingerprints: dict[tuple[str, tuple[str, int, str, str, str]], str] = {}
        self.config = AlertingConfig()
        self.set_config(config)

    # ------------------------------------------------------------ configuration and state

    def set_config(self, config: AlertingConfig) -> None:
        """Swap rules; series of rules that are unchanged keep their state, others start afresh."""
        old = {r.name: r for r in self.config.rules}
        self.config = config
        self.gpu_rules: list[GpuRule] = [r for r in config.rules if isinstance(r, GPU_KINDS)]
        self.heartbeat_rules = [r for r in config.rules if isinstance(r, HeartbeatRule)]
        self.event_rules = [r for r in config.rules if isinstance(r, EventRule)]
        self.finding_rules = [r for r in config.rules if isinstance(r, FindingRule)]
        new: dict[str, Rule] = {r.name: r for r in config.rules}
        self.baselines.forget({name for name in old if old[name] != new.get(name)})
        for fp, name in list(self.rule_of.items()):
            if name in new and old.get(name) != new[name] and not self.series[fp].firing:
                self.series.pop(fp, None)
                self.rule_of.pop(fp, None)

    def restore_firing(self, fingerprint: str, rule: str, labels: dict[str, str], starts_at: datetime,
                       now: datetime) -> None:
        """After a restart: this alert is firing, so the engine can resolve it later."""
        s = self._series(fingerprint, rule)
        s.firing, s.labels = True, labels
        s.last_hit = now.timestamp()
        r = self.config.rule(rule)
        if isinstance(r, EventRule):
            s.deadline = starts_at.timestamp() + r.resolve_after

    def observe_node(self, cluster: str, node: str, info: NodeInfo | None, now: datetime) -> None:
        """A node registered (info) or sent a heartbeat (info None): it is alive now."""
        if info is not None:
            self.nodes[(cluster, node)] = info
        self.last_seen[(cluster, node)] = max(self.last_seen.get((cluster, node), 0.0), now.timestamp())

    def _series(self, fp: str, rule: str) -> Series:
        s = self.series.get(fp)
        if s is None:
            s = self.series[fp] = Series()
        self.rule_of[fp] = rule
        return s

    # ------------------------------------------------------------ telemetry

    def observe_telemetry(self, batch: GpuTelemetry, now: datetime) -> list[Transition]:
        self.observe_node(batch.cluster, batch.node, None, now)
        info = self.nodes.get((batch.cluster, batch.node), NodeInfo())
        out: list[Transition] = []
        for sample in batch.gpus:
            out.extend(self._observe_gpu(batch, sample, info))
        return out

    def _observe_gpu(self, batch: GpuTelemetry, sample: GpuSample, info: NodeInfo) -> list[Transition]:
        t = batch.sample_time.timestamp()
        key = model_key(sample.model)
        model = self.models.get(key) if key else None
        ident = {"UUID": sample.uuid, "gpu": str(sample.index), "Hostname": batch.node,
                 "cluster": batch.cluster, "modelName": sample.model}
        where = (sample.uuid, sample.index, batch.node, batch.cluster, sample.model)
        cls: str | None = None
        out: list[Transition] = []
        for rule in self.gpu_rules:
            if rule.models and key not in rule.models:
                continue
            fp = self._gpu_fingerprint(rule.name, where, ident)
            s = self.series.get(fp)
            if s is None:
                s = self._series(fp, rule.name)
            verdict: Verdict | None
            if isinstance(rule, BaselineRule):
                cls = cls or self.workloads.of(sample)
                verdict = self.baselines.verdict(rule, s, sample, t, cls, batch.node, info.pool)
            else:
                verdict = evaluate(rule, s, sample, model, t)
            if verdict is None:
                continue
            cond, value, values = verdict
            # Most samples change nothing: skip building labels for them.
            if cond is Cond.FIRE:
                if s.firing:
                    continue
            elif not s.firing or cond is Cond.HOLD:
                s.pending_since = None
                continue
            labels = {**ident, **info.gpu_labels(sample.uuid, batch.node), **info.labels(), **rule.labels}
            values = {"uuid": sample.uuid, "gpu": sample.index, "node": batch.node, "cluster": batch.cluster,
                      "model": sample.model, "value": value, **values}
            tr = self._step(rule, s, fp, cond, value, labels, values, t, batch.sample_time)
            if tr is not None:
                out.append(tr)
        return out

    def _gpu_fingerprint(self, rule: str, where: tuple[str, int, str, str, str], ident: dict[str, str]) -> str:
        fp = self._fingerprints.get((rule, where))
        if fp is None:
            if len(self._fingerprints) > FINGERPRINT_CACHE:
                self._fingerprints.clear()
            fp = self._fingerprints[(rule, where)] = fingerprint({"alertname": rule, **ident})
        return fp

    def _step(self, rule: RuleBase, s: Series, fp: str, cond: Cond, value: float | None, labels: dict[str, str],
              values: dict[str, Any], t: float, at: datetime) -> Transition | None:
        """Apply `for` and emit a transition when the alert starts or stops firing."""
        if cond is Cond.FIRE:
            if s.firing:
                return None
            if s.pending_since is None:
                s.pending_since = t
            if t - s.pending_since < rule.for_s:
                return None
            s.firing, s.pending_since, s.labels = True, None, labels
            return Transition(True, rule, fp, labels, render(rule.summary, values), at, value)
        s.pending_since = None
        if cond is Cond.CLEAR and s.firing:
            s.firing = False
            node = labels.get("Hostname", "?")
            where = f"GPU {labels['gpu']} on {node}" if "gpu" in labels else node
            shown = f" ({value:.4g})" if isinstance(value, float) else ""
            return Transition(False, rule, fp, s.labels or labels, f"{rule.name} resolved: {where}{shown}", at, value)
        return None

    # ------------------------------------------------------------ workload classes (for baselines)

    def observe_job(self, job_id: str, workload_class: str, owner: tuple[str, str] | None = None) -> None:
        """A job was submitted: its GPUs' samples belong to `workload_class` while it runs; `owner` (team,
        project) is whom its failure alerts name."""
        self.workloads.observe(job_id, workload_class)
        if owner is not None:
            self.owners[job_id] = owner
            while len(self.owners) > JOB_CLASS_KEEP:
                self.owners.pop(next(iter(self.owners)))

    def forget_job(self, job_id: str) -> None:
        self.workloads.forget(job_id)
        self.owners.pop(job_id, None)

    def workload_class(self, sample: GpuSample) -> str:
        return self.workloads.of(sample)

    # ------------------------------------------------------------ heartbeats, events, time

    def tick(self, now: datetime) -> list[Transition]:
        """Time-driven checks: missing nodes, event alerts that age out, alerts of rules that were removed."""
        out = [tr for rule in self.heartbeat_rules for tr in self._heartbeats(rule, now)]
        t = now.timestamp()
        names = {r.name for r in self.config.rules}
        for fp, s in self.series.items():
            if not s.firing:
                continue
            name = self.rule_of.get(fp, "")
            rule = self.config.rule(name) if name in names else None
            if rule is None or (s.deadline is not None and t >= s.deadline):
                s.firing = False
                out.append(Transition(False, rule or RemovedRule(name), fp, s.labels, f"{name} resolved", now))
        return out

    def _heartbeats(self, rule: HeartbeatRule, now: datetime) -> list[Transition]:
        t = now.timestamp()
        out: list[Transition] = []
        for (cluster, node), seen in self.last_seen.items():
            info = self.nodes.get((cluster, node), NodeInfo())
            ident = {"Hostname": node, "cluster": cluster}
            fp = fingerprint({"alertname": rule.name, **ident})
            s = self._series(fp, rule.name)
            silent = t - seen
            labels = {**ident, "instance": node, **info.labels(), **rule.labels}
            if silent >= max(rule.for_s, 1.0) and not s.firing:
                s.firing, s.labels = True, labels
                values = {"node": node, "cluster": cluster, "value": silent, "silent_s": silent}
                out.append(Transition(True, rule, fp, labels, render(rule.summary, values), now, silent))
            elif silent < max(rule.for_s, 1.0) and s.firing:
                s.firing = False
                out.append(Transition(False, rule, fp, s.labels, f"{rule.name} resolved: {node} reporting again",
                                      now, silent))
        return out

    def observe_event(self, name: str, data: EventData, now: datetime) -> list[Transition]:
        out = []
        for rule in self.event_rules:
            if rule.event != name:
                continue
            fields = failure_fields(name, data.model_dump(mode="json"), self.owners.get(getattr(data, "job_id", "")))
            if fields is None:
                continue  # e.g. a job that finished with exit code 0
            ident = {k: str(fields.get(k, "")) for k in rule.key}
            fp = fingerprint({"alertname": rule.name, **ident})
            s = self._series(fp, rule.name)
            s.deadline = now.timestamp() + rule.resolve_after
            if s.firing:
                continue
            extra = {k: str(fields[k]) for k in rule.label_fields if fields.get(k) not in (None, "")}
            notes = {k: str(fields[k]) for k in rule.annotation_fields if fields.get(k) not in (None, "")}
            s.firing, s.labels = True, {**ident, **extra, **rule.labels}
            out.append(Transition(True, rule, fp, s.labels, render(rule.summary, fields), now, annotations=notes))
        return out

    # ------------------------------------------------------------ cost guardians

    def observe_findings(self, findings: list[Finding], now: datetime) -> list[Transition]:
        """One successful poll of inventory's findings: raise the new ones, resolve those no longer listed."""
        out: list[Transition] = []
        for rule in self.finding_rules:
            present = finding_rules.matching(rule, findings)
            for fp, (ident, f) in present.items():
                s = self._series(fp, rule.name)
                if s.firing:
                    continue
                values = finding_rules.summary_values(rule, ident, f)
                s.firing, s.labels = True, {**ident, **rule.labels}
                out.append(Transition(True, rule, fp, s.labels, render(rule.summary, values), now, values["value"]))
            for fp, name in list(self.rule_of.items()):
                if name != rule.name or fp in present:
                    continue
                gone = self.series.get(fp)
                if gone is not None and gone.firing:
                    gone.firing = False
                    what = ", ".join(f"{k} {v}" for k, v in gone.labels.items() if k != "finding" and v)
                    out.append(Transition(False, rule, fp, gone.labels,
                                          f"{rule.name} resolved: {what} no longer reported", now))
        return out
