"""Telemetry service: latest sample and rolling history of every GPU, per-job usage, DCGM `/metrics`.

Consumes gpu.telemetry, node.registered and the job events. A sample for a
node that has not registered yet is retried (registration may still be in
flight) and dead-lettered if it never appears; a GPU the node did not
register, a sample time too far from now, and a duplicate or out-of-order
sequence number are rejected at once (dead-lettered with the reason, counted).

The decisions live in plain modules: sequence.py (new / duplicate / restart),
history.py (points and minute rollups), usage.py (per-job usage), flags.py
(hot, throttled, erroring), dcgm.py (the exposition). This module is the shell.
"""

from __future__ import annotations

import asyncio
import gc
import json
from datetime import datetime, timedelta, timezone

from fastapi import FastAPI, HTTPException, Query
from prometheus_client import Counter, Histogram
from pydantic import BaseModel, Field

from whaleflux.shared.bus import Reject, Retry, batch_handler
from whaleflux.shared.events import (
    Envelope,
    EventData,
    GpuIdentity,
    GpuSample,
    GpuTelemetry,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    decode_typed,
)
from whaleflux.shared.service import ServiceBase, run_service
from whaleflux.shared.settings import CommonSettings

from . import dcgm
from .flags import flags
from .history import Point, Rollup, minutes_to_roll, resolution_for, roll_offset
from .sequence import Last, Verdict, judge
from .store import STORE_SCRIPT, BatchWrite, samples_of
from .usage import JobUsage, from_points, from_rollups


class TelemetrySettings(CommonSettings):
    http_port: int = 8701
    max_clock_skew_s: float = Field(300.0, gt=0)
    raw_retention_s: float = Field(7200.0, ge=3600, description="raw history kept per GPU (at least 1 h)")
    rollup_retention_s: float = Field(7 * 86400.0, gt=0, description="minute rollups kept per GPU")
    stale_after_s: float = Field(15.0, gt=0, description="a GPU with no newer sample is stale (left out of /metrics)")
    maintenance_interval_s: float = Field(20.0, gt=0)
    rollup_grace_s: float = Field(5.0, ge=0, description="wait this long after a minute ends before rolling it up")


class LatestSample(BaseModel):
    cluster: str
    node: str
    seq: int
    sample_time: str
    gpu: GpuSample


class JobRef(BaseModel):
    job_id: str
    name: str | None = None
    team: str | None = None
    project: str | None = None


class GpuStatus(LatestSample):
    """The latest sample with what the monitor needs: age, flags, last XID and the job holding the GPU."""

    age_s: float
    stale: bool
    flags: list[str]
    last_xid: int | None = None
    job: JobRef | None = None


class NodeSummary(BaseModel):
    cluster: str
    node: str
    gpus: int
    model: str
    util_mean_pct: float
    power_w: float | None
    memory_used_mib: float
    memory_total_mib: float
    last_sample_time: str
    stale: bool
    flagged_gpus: int


def _epoch(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()


SILENT_S = 10.0  # a node with no batch stored for this long has its minutes rolled by the sweep
TRIM_EVERY_S = 600.0  # how often the sweep trims a silent node's history (ingest trims the others)
SWEEP_CHUNK = 200  # GPUs per store script call in the sweep


class TelemetryService(ServiceBase):
    name = "telemetry"

    def __init__(self, settings: TelemetrySettings, **kw):
        super().__init__(settings, **kw)
        self.settings: TelemetrySettings = settings
        self._known: dict[str, set[str]] = {}  # node -> registered GPU uuids (cache of Redis)
        self._last: dict[str, Last] = {}  # "cluster/node" -> last stored batch (cache of Redis)
        self._offsets: dict[str, float] = {}  # "cluster/node" -> its roll offset (history.roll_offset)
        self._swept: dict[str, tuple[float, float]] = {}  # silent "cluster/node" -> (last minute rolled, last trim)
        self._gone: set[str] = set()  # GPUs missing from their node's batches (cache of Redis)
        self.stored = Counter("whaleflux_telemetry_gpu_samples_stored", "GPU samples stored", registry=self.registry)
        self.flagged = Counter(
            "whaleflux_telemetry_batches_flagged",
            "Telemetry batches flagged: duplicate_seq and out_of_order are dead-lettered, seq_reset is stored",
            ["reason"],
            registry=self.registry,
        )
        self.lag = Histogram(
            "whaleflux_telemetry_store_lag_seconds",
            "From a batch's sample time to its samples stored in Redis",
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        )

    # ------------------------------------------------------------------ keys

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def consumers(self):
        return {"telemetry-gpu": self.on_telemetry_batch, "telemetry-nodes": self.on_registered, "telemetry-jobs": self.on_job}

    def background(self):
        return [self.maintain_history, self.settle_jobs]

    async def on_ready(self) -> None:
        await super().on_ready()
        self._store = self.redis.register_script(STORE_SCRIPT)
        self._gone = set(await self.redis.hkeys(self._k("gone")))
        # Everything loaded so far lives as long as the process: keep it out of the cyclic
        # GC's full collections, which otherwise pause ingest for tens of ms (p99 latency).
        gc.freeze()

    # ------------------------------------------------------------------ nodes

    async def on_registered(self, env: Envelope, data: NodeRegistered) -> None:
        key = self._k("node", data.cluster, data.node)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            if data.gpus:
                pipe.sadd(key, *[g.uuid for g in data.gpus])
                pipe.hset(self._k("identity"), mapping={g.uuid: g.model_dump_json() for g in data.gpus})
                pipe.hset(self._k("gpunode"), mapping={g.uuid: f"{data.cluster}/{data.node}" for g in data.gpus})
            await pipe.execute()
        self._known[f"{data.cluster}:{data.node}"] = {g.uuid for g in data.gpus}

    async def _registered_gpus(self, cluster: str, node: str) -> set[str]:
        cached = self._known.get(f"{cluster}:{node}")
        if cached is None:
            cached = set(await self.redis.smembers(self._k("node", cluster, node)))
            if cached:
                self._known[f"{cluster}:{node}"] = cached
        return cached

    # ------------------------------------------------------------------ samples

    async def _last_of(self, node_key: str) -> Last | None:
        last = self._last.get(node_key)
        if last is None:
            raw = await self.redis.hget(self._k("seq"), node_key)
            last = Last.decode(raw) if raw else None
        return last

    async def on_telemetry(self, env: Envelope, data: GpuTelemetry) -> None:
        """One batch on its own (the consumer runs `on_telemetry_batch`)."""
        (outcome,) = await self.on_telemetry_batch([(env, data)])
        if outcome is not None:
            raise outcome

    @batch_handler
    async def on_telemetry_batch(self, events: list[tuple[Envelope, GpuTelemetry]]) -> list[Exception | None]:
        """Check each node batch in order, then store all admitted ones in one Redis call."""
        outcomes: list[Exception | None] = [None] * len(events)
        accepted: dict[str, Last] = {}  # node -> last batch admitted so far in this call
        previous: dict[str, GpuTelemetry] = {}  # node -> its batch admitted last in this call
        write = self._write()
        times = []
        for i, (env, data) in enumerate(events):
            node_key = f"{data.cluster}/{data.node}"
            t = data.sample_time.timestamp()
            last = accepted.get(node_key) or await self._last_of(node_key)
            try:
                known = await self._admit(data, node_key, t, last)
            except (Reject, Retry) as exc:
                outcomes[i] = exc
                continue
            accepted[node_key] = Last(data.seq, t)
            write.add(data, node_key, t, env.wire())
            if len(data.gpus) != len(known) or self._gone:
                await self._track_gone(write, data, node_key, known, previous.get(node_key))
            previous[node_key] = data
            minutes = minutes_to_roll(last.t if last else None, t, self._offset(node_key))
            if minutes:  # every registered GPU of the node, also one that stopped reporting
                write.roll(sorted(known), minutes)
            times.append(t)
        if not accepted:
            return outcomes
        await self._run_store(write)
        self._last.update(accepted)
        self.stored.inc(write.samples)
        now = self.clock().timestamp()
        for t in times:
            self.lag.observe(max(now - t, 0.0))
        return outcomes

    async def _track_gone(self, write: BatchWrite, data: GpuTelemetry, node_key: str, known: set[str],
                          previous: GpuTelemetry | None) -> None:
        """Keep the last sample of GPUs that vanished from the node's batches; forget it when they return."""
        present = {g.uuid for g in data.gpus}
        went = known - present - self._gone
        if went:
            if previous is None:
                raw = await self.redis.hget(self._k("nodebatch"), node_key)
                previous = decode_typed(raw)[1] if raw else None
            if previous is not None:
                write.went(previous, went)
            self._gone |= went
        back = present & self._gone
        if back:
            write.returned(back)
            self._gone -= back

    async def _admit(self, data: GpuTelemetry, node_key: str, t: float, last: Last | None) -> set[str]:
        """Raise Reject or Retry unless this node batch is to be stored; return the node's registered GPUs."""
        skew = abs(data.sample_time - self.clock())
        if skew > timedelta(seconds=self.settings.max_clock_skew_s):
            raise Reject(f"sample_time is {skew.total_seconds():.0f}s away from now (limit {self.settings.max_clock_skew_s:.0f}s)")
        known = await self._registered_gpus(data.cluster, data.node)
        if not known:
            raise Retry(f"node {data.cluster}/{data.node} has not registered its GPUs", delay_s=1.0)
        unknown = [g.uuid for g in data.gpus if g.uuid not in known]
        if unknown:
            raise Reject(f"unknown GPU uuid(s) for node {data.cluster}/{data.node}: {', '.join(unknown[:4])}")
        verdict = judge(last, data.seq, t)
        if verdict in (Verdict.DUPLICATE, Verdict.OUT_OF_ORDER):
            self.flagged.labels(verdict.value).inc()
            raise Reject(
                f"{verdict.value}: seq {data.seq} sampled {data.sample_time.isoformat()} from {node_key}, "
                f"but seq {last.seq} sampled {datetime.fromtimestamp(last.t, timezone.utc).isoformat()} is already stored"
            )
        if verdict is Verdict.RESTART:
            self.flagged.labels(verdict.value).inc()
            self.log.info("telemetry.seq_reset", node=node_key, seq=data.seq, last_seq=last.seq)
        return known

    # ------------------------------------------------------------------ jobs

    async def on_job(self, env: Envelope, data: EventData) -> None:
        key = self._k("job", data.job_id)
        pipe = self.redis.pipeline(transaction=True)
        if isinstance(data, JobSubmitted):
            pipe.hset(key, mapping={"name": data.name, "team": data.team, "project": data.project})
        elif isinstance(data, (JobPlaced, JobStarted)):
            fields = {"cluster": data.cluster, "node": data.node, "attempt": data.attempt, "gpu_uuids": json.dumps(data.gpu_uuids)}
            if isinstance(data, JobPlaced):
                fields.update(team=data.team, project=data.project, state="placed")
            else:
                fields.update(started_at=data.started_at.isoformat(), state="running")
            if data.rank is not None:
                # A gang spanning nodes reports each node's part: the job's GPUs are all parts' of this attempt.
                fields = await self._gang_fields(key, data, fields)
            pipe.hset(key, mapping=fields)
            pipe.hdel(key, "finished_at", "usage")
            pipe.hset(self._k("gpujob"), mapping={u: data.job_id for u in data.gpu_uuids})
        elif isinstance(data, (JobFinished, JobFailed)):
            ended = data.finished_at if isinstance(data, JobFinished) else data.failed_at
            if data.rank is not None:  # a gang's run ends with its last part
                before = await self.redis.hget(key, "finished_at")
                ended = max(ended, datetime.fromisoformat(before)) if before else ended
            pipe.hset(key, mapping={"finished_at": ended.isoformat(), "state": "finished" if isinstance(data, JobFinished) else "failed"})
            raw_uuids = await self.redis.hget(key, "gpu_uuids")
            holders = await self.redis.hmget(self._k("gpujob"), json.loads(raw_uuids)) if raw_uuids else []
            mine = [u for u, j in zip(json.loads(raw_uuids or "[]"), holders) if j == data.job_id]
            if mine:
                pipe.hdel(self._k("gpujob"), *mine)
            pipe.sadd(self._k("jobs", "unsettled"), data.job_id)
        await pipe.execute()

    async def _gang_fields(self, key: str, data: JobPlaced | JobStarted, fields: dict) -> dict:
        attempt, uuids, node = await self.redis.hmget(key, "attempt", "gpu_uuids", "node")
        if attempt == str(data.attempt) and uuids:
            fields["gpu_uuids"] = json.dumps(sorted(set(json.loads(uuids)) | set(data.gpu_uuids)))
            if data.rank:  # the job's node is its rank-0 node
                fields.update(node=node or data.node)
        if isinstance(data, JobStarted):
            started = await self.redis.hget(key, "started_at")
            if attempt == str(data.attempt) and started and datetime.fromisoformat(started) < data.started_at:
                fields["started_at"] = started  # the gang's run starts with its first part
        return fields

    async def job_usage(self, job_id: str) -> JobUsage:
        """Usage of the job's GPUs over its run (so far); stored once the job has ended and settled."""
        rec = await self.redis.hgetall(self._k("job", job_id))
        if not rec or "started_at" not in rec:
            raise HTTPException(404, f"job_id: no run of job {job_id!r} is known to telemetry (not started yet?)")
        if "usage" in rec:
            return JobUsage.model_validate_json(rec["usage"])
        now = self.clock().timestamp()
        since = _epoch(rec["started_at"])
        until = _epoch(rec["finished_at"]) if "finished_at" in rec else now
        uuids = json.loads(rec.get("gpu_uuids", "[]"))
        # Samples of the last moments of a run may still be in flight.
        complete = "finished_at" in rec and until < now - 2 * self.settings.rollup_grace_s
        pipe = self.redis.pipeline(transaction=False)
        if resolution_for(since, now, self.settings.raw_retention_s) == "raw":
            for u in uuids:
                pipe.zrangebyscore(self._k("raw", u), since, until)
            rows = await pipe.execute()
            usage = from_points(job_id, {u: [Point.decode(r) for r in rs] for u, rs in zip(uuids, rows)}, complete)
        else:
            for u in uuids:
                pipe.zrangebyscore(self._k("1m", u), since // 60 * 60, until)
            rows = await pipe.execute()
            usage = from_rollups(job_id, {u: [Rollup.decode(r) for r in rs] for u, rs in zip(uuids, rows)}, complete)
        if complete:
            async with self.redis.pipeline(transaction=True) as p:
                p.hset(self._k("job", job_id), "usage", usage.model_dump_json())
                p.srem(self._k("jobs", "unsettled"), job_id)
                await p.execute()
        return usage

    async def settle_jobs(self) -> None:
        """Store the usage of ended jobs, so it outlives the raw history."""
        while True:
            for job_id in await self.redis.smembers(self._k("jobs", "unsettled")):
                try:
                    await self.job_usage(job_id)
                except HTTPException:
                    await self.redis.srem(self._k("jobs", "unsettled"), job_id)
            await asyncio.sleep(self.settings.rollup_grace_s or 1.0)

    # ------------------------------------------------------------------ history upkeep

    def _offset(self, node_key: str) -> float:
        offset = self._offsets.get(node_key)
        if offset is None:
            offset = self._offsets[node_key] = roll_offset(node_key, self.settings.rollup_grace_s)
        return offset

    def _write(self) -> BatchWrite:
        now, s = self.clock().timestamp(), self.settings
        return BatchWrite(lambda u: self._k("raw", u), lambda u: self._k("1m", u),
                          now - s.raw_retention_s, now - s.rollup_retention_s)

    async def _run_store(self, write: BatchWrite) -> None:
        keys, args = write.script_args(self._k("nodebatch"), self._k("lastxid"), self._k("seq"), self._k("gone"))
        await self._store(keys=keys, args=args)

    async def maintain_history(self) -> None:
        """Roll up and trim the history of nodes that fell silent (ingest does it for the others)."""
        while True:
            await self.roll_and_trim()
            await asyncio.sleep(self.settings.maintenance_interval_s)

    async def roll_and_trim(self) -> None:
        """The minutes a silent node's last batches left unrolled, and its history trimmed every TRIM_EVERY_S."""
        now = self.clock().timestamp()
        write, gpus = self._write(), 0
        for node_key, raw in sorted((await self.redis.hgetall(self._k("seq"))).items()):
            last = Last.decode(raw)
            if now - last.t < SILENT_S:
                continue
            rolled, trimmed = self._swept.get(node_key, (float("-inf"), float("-inf")))
            minutes = [m for m in minutes_to_roll(last.t, now, self._offset(node_key)) if m > rolled]
            if not minutes and now - trimmed < TRIM_EVERY_S:
                continue
            cluster, node = node_key.split("/", 1)
            uuids = sorted(await self._registered_gpus(cluster, node))
            if minutes:
                write.roll(uuids, minutes)
            else:
                write.trim(uuids)
            self._swept[node_key] = (minutes[-1] if minutes else rolled, now)
            gpus += len(uuids)
            if gpus >= SWEEP_CHUNK:
                await self._run_store(write)
                write, gpus = self._write(), 0
        if gpus:
            await self._run_store(write)

    # ------------------------------------------------------------------ reads

    async def _jobs_by_gpu(self) -> dict[str, JobRef]:
        holders = await self.redis.hgetall(self._k("gpujob"))
        job_ids = sorted(set(holders.values()))
        pipe = self.redis.pipeline(transaction=False)
        for j in job_ids:
            pipe.hmget(self._k("job", j), ["name", "team", "project"])
        rows = await pipe.execute() if job_ids else []
        refs = {j: JobRef(job_id=j, name=r[0], team=r[1], project=r[2]) for j, r in zip(job_ids, rows)}
        return {u: refs[j] for u, j in holders.items()}

    async def latest(self, node: str | None = None) -> list[LatestSample]:
        """Every GPU's latest sample (optionally of one node), sorted by node and index."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self._k("nodebatch"))
        pipe.hgetall(self._k("gone"))
        batches, gone = await pipe.execute()
        out = [LatestSample.model_validate_json(raw) for raw in gone.values()]
        for node_key, raw in batches.items():
            if node is None or node_key.split("/", 1)[1] == node:
                out += [LatestSample(**fields) for fields in samples_of(decode_typed(raw)[1])]
        return sorted((s for s in out if node is None or s.node == node), key=lambda s: (s.node, s.gpu.index))

    async def _latest_of(self, uuid: str) -> LatestSample | None:
        node_key = await self.redis.hget(self._k("gpunode"), uuid)
        raw = await self.redis.hget(self._k("nodebatch"), node_key) if node_key else None
        for fields in samples_of(decode_typed(raw)[1]) if raw else []:
            if fields["gpu"].uuid == uuid:
                return LatestSample(**fields)
        gone = await self.redis.hget(self._k("gone"), uuid)
        return LatestSample.model_validate_json(gone) if gone else None

    async def statuses(self, node: str | None = None) -> list[GpuStatus]:
        """Every GPU's latest sample with age, flags, last XID and job, sorted by node and index."""
        xids = await self.redis.hgetall(self._k("lastxid"))
        jobs = await self._jobs_by_gpu()
        out = []
        for s in await self.latest(node):
            last_xid = int(xids[s.gpu.uuid]) if s.gpu.uuid in xids else None
            out.append(self._status(s, last_xid, jobs.get(s.gpu.uuid)))
        return out

    def _status(self, s: LatestSample, last_xid: int | None, job: JobRef | None) -> GpuStatus:
        age = self.clock().timestamp() - _epoch(s.sample_time)
        stale = age > self.settings.stale_after_s
        return GpuStatus(**s.model_dump(), age_s=round(age, 3), stale=stale, flags=flags(s.gpu, last_xid, stale),
                         last_xid=last_xid, job=job)

    async def metrics_text(self) -> bytes:
        """Service metrics, then every fresh GPU's DCGM families."""
        base = await super().metrics_text()
        if self.redis is None:
            return base
        identities = {u: GpuIdentity.model_validate_json(v) for u, v in (await self.redis.hgetall(self._k("identity"))).items()}
        states = []
        for st in await self.statuses():
            if st.stale:
                continue  # a GPU that stopped reporting must not look alive (dcgm-exporter's series vanish too)
            job = dcgm.JobLabels(st.job.job_id, st.job.team or "", st.job.project or "") if st.job else None
            states.append(dcgm.GpuState(st.cluster, st.node, st.gpu, identities.get(st.gpu.uuid), job, st.last_xid or 0))
        return base + dcgm.render(states).encode()

    def add_routes(self, app: FastAPI, admin) -> None:
        @app.get("/v1/fleet", tags=["telemetry"])
        async def fleet() -> dict:
            """Fleet totals: GPUs and nodes reporting, by model, and how many are stale, hot, throttled or erroring."""
            gpus = await self.statuses()
            by_model: dict[str, dict] = {}
            for g in gpus:
                m = by_model.setdefault(g.gpu.model, {"gpus": 0, "util_sum": 0.0, "power_w": 0.0, "memory_used_mib": 0.0, "memory_total_mib": 0.0})
                m["gpus"] += 1
                m["util_sum"] += g.gpu.utilization_gpu_pct
                m["power_w"] += g.gpu.power_w or 0.0
                m["memory_used_mib"] += g.gpu.memory_used_mib
                m["memory_total_mib"] += g.gpu.memory_total_mib
            for m in by_model.values():
                m["util_mean_pct"] = round(m.pop("util_sum") / m["gpus"], 1)
                m["power_w"] = round(m["power_w"], 1)
            count = lambda flag: sum(1 for g in gpus if flag in g.flags)  # noqa: E731
            return {
                "gpus": len(gpus),
                "nodes": len({(g.cluster, g.node) for g in gpus}),
                "power_w": round(sum(g.gpu.power_w or 0.0 for g in gpus), 1),
                "stale": count("stale"),
                "hot": count("hot"),
                "throttled": count("throttled"),
                "erroring": sum(1 for g in gpus if {"xid", "ecc", "nvlink"} & set(g.flags)),
                "with_job": sum(1 for g in gpus if g.job),
                "by_model": by_model,
            }

        @app.get("/v1/nodes", tags=["telemetry"])
        async def nodes() -> list[NodeSummary]:
            """One row per node: GPUs reporting, mean utilization, power, memory, last sample."""
            grouped: dict[tuple[str, str], list[GpuStatus]] = {}
            for g in await self.statuses():
                grouped.setdefault((g.cluster, g.node), []).append(g)
            return [_summary(c, n, gs) for (c, n), gs in sorted(grouped.items())]

        @app.get("/v1/nodes/{node}", tags=["telemetry"])
        async def node(node: str) -> dict:
            """One node's summary and its GPUs."""
            gs = await self.statuses(node)
            if not gs:
                raise HTTPException(404, f"node: no samples from a node named {node!r}")
            return {"summary": _summary(gs[0].cluster, node, gs), "gpus": gs}

        @app.get("/v1/gpus", tags=["telemetry"])
        async def gpus(node: str | None = None) -> list[GpuStatus]:
            """Latest sample of every GPU (optionally of one node), with flags and the job holding it."""
            return await self.statuses(node)

        @app.get("/v1/gpus/{uuid}", tags=["telemetry"])
        async def gpu(uuid: str) -> GpuStatus:
            """Latest sample of one GPU."""
            sample = await self._latest_of(uuid)
            if sample is None:
                raise HTTPException(404, f"uuid: no sample for GPU {uuid!r}")
            pipe = self.redis.pipeline(transaction=False)
            pipe.hget(self._k("lastxid"), uuid)
            pipe.hget(self._k("gpujob"), uuid)
            xid, job_id = await pipe.execute()
            job = None
            if job_id:
                name, team, project = await self.redis.hmget(self._k("job", job_id), ["name", "team", "project"])
                job = JobRef(job_id=job_id, name=name, team=team, project=project)
            return self._status(sample, int(xid) if xid else None, job)

        @app.get("/v1/gpus/{uuid}/history", tags=["telemetry"])
        async def history(
            uuid: str,
            since: datetime | None = Query(None, description="default: 10 minutes ago"),
            until: datetime | None = Query(None, description="default: now"),
            resolution: str = Query("auto", pattern="^(auto|raw|1m)$"),
        ) -> dict:
            """Raw points (1 s) within the raw retention, minute rollups beyond it."""
            now = self.clock()
            since_t = (since or now - timedelta(minutes=10)).timestamp()
            until_t = (until or now).timestamp()
            if since_t >= until_t:
                raise HTTPException(400, "since: must be before until")
            if not await self.redis.hexists(self._k("gpunode"), uuid):
                raise HTTPException(404, f"uuid: no sample for GPU {uuid!r}")
            res = resolution_for(since_t, now.timestamp(), self.settings.raw_retention_s) if resolution == "auto" else resolution
            rows = await self.redis.zrangebyscore(self._k("raw" if res == "raw" else "1m", uuid), since_t, until_t)
            decode = Point.decode if res == "raw" else Rollup.decode
            return {"uuid": uuid, "resolution": res, "points": [decode(r).as_dict() for r in rows]}

        @app.get("/v1/jobs/{job_id}/usage", tags=["telemetry"])
        async def job_usage(job_id: str) -> JobUsage:
            """Mean/peak utilization and memory and the energy of a job's GPUs over its run."""
            return await self.job_usage(job_id)


def _summary(cluster: str, node: str, gs: list[GpuStatus]) -> NodeSummary:
    powers = [g.gpu.power_w for g in gs if g.gpu.power_w is not None]
    return NodeSummary(
        cluster=cluster,
        node=node,
        gpus=len(gs),
        model=gs[0].gpu.model,
        util_mean_pct=round(sum(g.gpu.utilization_gpu_pct for g in gs) / len(gs), 1),
        power_w=round(sum(powers), 1) if powers else None,
        memory_used_mib=round(sum(g.gpu.memory_used_mib for g in gs), 1),
        memory_total_mib=round(sum(g.gpu.memory_total_mib for g in gs), 1),
        last_sample_time=max(g.sample_time for g in gs),
        stale=all(g.stale for g in gs),
        flagged_gpus=sum(1 for g in gs if g.flags),
    )


def main() -> None:
    run_service(TelemetryService(TelemetrySettings()))
