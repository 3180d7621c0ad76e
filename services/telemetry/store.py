"""How a fetch of telemetry batches is written to Redis: one script call for all of it. No I/O.

Per GPU sample the service writes its latest-sample JSON and one raw history
point. Sent as single commands (a ZADD and an HSET field per GPU per batch),
redis-py's packing and reply parsing cost more than everything else the
service does per sample; one EVALSHA whose argument is a single JSON document
costs one `json.dumps` in C and one round trip (bench/RESULTS.md, Telemetry).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from whaleflux.shared.events import GpuTelemetry

from .history import Point
from .sequence import Last

# KEYS: the latest-sample hash, the last-XID hash, the per-node sequence hash, then
# one raw-history key per point (declared, as scripts should, not built in Lua).
# ARGV[1]: {"p": [[score, member], ...], "latest": [uuid, json, ...], "xid": [...], "seq": [...]}.
# Scores travel as strings: Lua would print numbers with 14 digits.
STORE_SCRIPT = """
local b = cjson.decode(ARGV[1])
for i, p in ipairs(b.p) do
  redis.call('ZADD', KEYS[3 + i], p[1], p[2])
end
for n, key in ipairs({KEYS[1], KEYS[2], KEYS[3]}) do
  local flat = b[({'latest', 'xid', 'seq'})[n]]
  for i = 1, #flat, 2 do
    redis.call('HSET', key, flat[i], flat[i + 1])
  end
end
return #b.p
"""


def latest_entries(data: GpuTelemetry) -> dict[str, str]:
    """uuid -> LatestSample JSON for each GPU of a node batch.

    Built around each GPU's own JSON instead of a LatestSample per GPU: the same
    document (tests/test_bus_batch.py checks it) at about half the cost.
    """
    head = (f'{{"cluster":{json.dumps(data.cluster)},"node":{json.dumps(data.node)},"seq":{data.seq},'
            f'"sample_time":{json.dumps(data.sample_time.isoformat())},"gpu":')
    return {g.uuid: f"{head}{g.model_dump_json()}}}" for g in data.gpus}


@dataclass
class BatchWrite:
    """What one call of STORE_SCRIPT writes for the node batches admitted from one fetch."""

    raw_keys: list[str] = field(default_factory=list)
    points: list[list[str]] = field(default_factory=list)
    latest: dict[str, str] = field(default_factory=dict)
    xids: dict[str, str] = field(default_factory=dict)
    seqs: dict[str, str] = field(default_factory=dict)
    samples: int = 0

    def add(self, data: GpuTelemetry, node_key: str, t: float, raw_key) -> None:
        """Add an admitted node batch; a later batch of the same node overwrites latest and seq (they come in order)."""
        score = repr(t)
        for g in data.gpus:
            self.raw_keys.append(raw_key(g.uuid))
            self.points.append([score, Point.encode_sample(t, g)])
            if g.xid_errors:
                self.xids[g.uuid] = str(g.xid_errors[-1])
        self.latest.update(latest_entries(data))
        self.seqs[node_key] = Last(data.seq, t).encode()
        self.samples += len(data.gpus)

    def script_args(self, latest_key: str, xid_key: str, seq_key: str) -> tuple[list[str], list[str]]:
        flat = lambda d: [x for kv in d.items() for x in kv]  # noqa: E731
        doc = {"p": self.points, "latest": flat(self.latest), "xid": flat(self.xids), "seq": flat(self.seqs)}
        return [latest_key, xid_key, seq_key, *self.raw_keys], [json.dumps(doc, separators=(",", ":"))]
