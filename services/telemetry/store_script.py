"""The Lua script that store.py writes a fetch of telemetry batches with, and its arguments. No I/O.

Per node batch the service stores the message itself as the node's latest
sample (the bytes as received: re-encoding every GPU's sample cost more than
validating it) and per GPU one raw history point. Sent as single commands,
redis-py's packing and reply parsing cost more than everything else the
service does per sample; one EVALSHA costs one `json.dumps` in C and one round
trip (bench/RESULTS.md, Telemetry). A GPU that stops appearing in its node's
batches keeps its last sample on its own (`gone`), so it shows as stale.

The same call rolls up the minutes a batch completes (history.minutes_to_roll)
and trims those GPUs' history past its retention, inside Redis: a periodic
sweep over the whole fleet reading every raw point back into Python stalled
ingest for tens of milliseconds at a time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from whaleflux.shared.events import GpuTelemetry

from .admission import Last
from .history import Point

# KEYS: the per-node latest hash, the last-XID hash, the per-node sequence hash, the
# gone-GPU hash, then the history keys the document names by index (declared, as
# scripts should, not built in Lua).
# ARGV[1]: {"p": [[key, score, member], ...], "xid": [uuid, xid, ...], "seq": [node, "seq t", ...],
#           "gone": [uuid, LatestSample JSON, ...], "back": [uuid, ...],
#           "roll": [[raw key, rollup key, minute start, "(minute end"], ...], "trim": [[raw key, rollup key], ...],
#           "raw_cut": "(t", "agg_cut": "(t"};
# ARGV[2...]: node, message bytes, node, message bytes, ... (the latest batch of each node).
# Scores travel as strings: Lua would print numbers with 14 digits. A rollup is
# history.rollup() of the minute's raw points, its maxima and energies copied as
# stored text, its means rounded like round(x, 2) (memory: 1 decimal).
STORE_SCRIPT = """
local b = cjson.decode(ARGV[1])
for _, p in ipairs(b.p) do
  redis.call('ZADD', KEYS[p[1]], p[2], p[3])
end
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
for n, key in ipairs({KEYS[2], KEYS[3], KEYS[4]}) do
  local flat = b[({'xid', 'seq', 'gone'})[n]]
  for i = 1, #flat, 2 do
    redis.call('HSET', key, flat[i], flat[i + 1])
  end
end
for _, uuid in ipairs(b.back) do
  redis.call('HDEL', KEYS[4], uuid)
end
local rolled = 0
for _, r in ipairs(b.roll) do
  local members = redis.call('ZRANGEBYSCORE', KEYS[r[1]], r[3], r[4])
  local n = #members
  if n > 0 then
    local sum, max, maxtext = {0, 0, 0, 0}, {}, {}
    local np, efirst, elast = 0, 'null', 'null'
    for _, s in ipairs(members) do
      local f, i = {}, 0
      for tok in string.gmatch(string.sub(s, 2, -2), '[^,]+') do
        i = i + 1
        f[i] = tok
      end
      for c = 2, 5 do
        if f[c] ~= 'null' then
          local x = tonumber(f[c])
          sum[c - 1] = sum[c - 1] + x
          if max[c - 1] == nil or x > max[c - 1] then
            max[c - 1], maxtext[c - 1] = x, f[c]
          end
          if c == 5 then np = np + 1 end
        end
      end
      if f[6] ~= 'null' then
        if efirst == 'null' then efirst = f[6] end
        elast = f[6]
      end
    end
    local power = 'null,null'
    if np > 0 then power = string.format('%.2f', sum[4] / np) .. ',' .. maxtext[4] end
    local doc = '[' .. r[3] .. ',' .. n .. ',' .. string.format('%.2f', sum[1] / n) .. ',' .. maxtext[1] .. ','
      .. string.format('%.1f', sum[2] / n) .. ',' .. maxtext[2] .. ',' .. string.format('%.2f', sum[3] / n) .. ','
      .. maxtext[3] .. ',' .. power .. ',' .. efirst .. ',' .. elast .. ']'
    redis.call('ZREMRANGEBYSCORE', KEYS[r[2]], r[3], r[3])
    redis.call('ZADD', KEYS[r[2]], r[3], doc)
    rolled = rolled + 1
  end
end
for _, k in ipairs(b.trim) do
  redis.call('ZREMRANGEBYSCORE', KEYS[k[1]], '-inf', b.raw_cut)
  redis.call('ZREMRANGEBYSCORE', KEYS[k[2]], '-inf', b.agg_cut)
end
return rolled
"""


def encode_last(last: Last) -> str:
    """A node's last stored batch as the `seq` hash keeps it: `"<seq> <sample time>"`."""
    return f"{last.seq} {last.t}"


def decode_last(raw: str) -> Last:
    seq, t = raw.split()
    return Last(int(seq), float(t))


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
    """What one call of STORE_SCRIPT writes: admitted node batches, minutes to roll, history to trim.

    `raw_key(uuid)` and `agg_key(uuid)` name a GPU's raw history and minute rollups;
    history older than `raw_cut` / `agg_cut` (epoch seconds) is trimmed with each roll.
    """

    raw_key: Callable[[str], str]
    agg_key: Callable[[str], str]
    raw_cut: float
    agg_cut: float
    keys: list[str] = field(default_factory=list)
    points: list[list[Any]] = field(default_factory=list)
    rolls: list[list[Any]] = field(default_factory=list)
    trims: list[list[int]] = field(default_factory=list)
    latest: dict[str, bytes] = field(default_factory=dict)
    xids: dict[str, str] = field(default_factory=dict)
    seqs: dict[str, str] = field(default_factory=dict)
    gone: dict[str, str] = field(default_factory=dict)
    back: set[str] = field(default_factory=set)
    samples: int = 0
    _index: dict[str, int] = field(default_factory=dict)

    def _key(self, key: str) -> int:
        """The key's 1-based position in KEYS (after the four hashes)."""
        i = self._index.get(key)
        if i is None:
            self.keys.append(key)
            i = self._index[key] = len(self.keys) + 4
        return i

    def add(self, data: GpuTelemetry, node_key: str, t: float, wire: bytes) -> None:
        """Add an admitted node batch, `wire` its message (a later batch of the same node overwrites latest and seq:
        they come in order)."""
        score = repr(t)
        for g in data.gpus:
            self.points.append([self._key(self.raw_key(g.uuid)), score, Point.encode_sample(t, g)])
            if g.xid_errors:
                self.xids[g.uuid] = str(g.xid_errors[-1])
        self.latest[node_key] = wire
        self.seqs[node_key] = encode_last(Last(data.seq, t))
        self.samples += len(data.gpus)

    def went(self, previous: GpuTelemetry, uuids: set[str]) -> None:
        """These GPUs of the node's `previous` batch are missing from its batches now: keep their last sample."""
        self.gone.update((u, doc) for u, doc in latest_entries(previous).items() if u in uuids)
        self.back -= uuids

    def returned(self, uuids: set[str]) -> None:
        """These gone GPUs are in their node's batch again."""
        self.back |= uuids
        for u in uuids:
            self.gone.pop(u, None)

    def roll(self, uuids: list[str], minutes: list[float]) -> None:
        """Roll these GPUs' `minutes` up and trim their history."""
        for u in uuids:
            raw, agg = self._key(self.raw_key(u)), self._key(self.agg_key(u))
            self.rolls += [[raw, agg, repr(m), f"({m + 60!r}"] for m in minutes]
            self.trims.append([raw, agg])

    def trim(self, uuids: list[str]) -> None:
        self.trims += [[self._key(self.raw_key(u)), self._key(self.agg_key(u))] for u in uuids]

    def script_args(self, latest_key: str, xid_key: str, seq_key: str, gone_key: str) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of the script call."""
        doc = {"p": self.points, "xid": _flat(self.xids), "seq": _flat(self.seqs), "gone": _flat(self.gone),
               "back": sorted(self.back), "roll": self.rolls, "trim": self.trims,
               "raw_cut": f"({self.raw_cut!r}", "agg_cut": f"({self.agg_cut!r}"}
        keys = [latest_key, xid_key, seq_key, gone_key, *self.keys]
        return keys, [json.dumps(doc, separators=(",", ":")), *_flat(self.latest)]


def _flat(d: dict[str, Any]) -> list[Any]:
    return [x for kv in d.items() for x in kv]


def samples_of(data: GpuTelemetry) -> list[dict[str, Any]]:
    """The LatestSample fields of each GPU of a stored node batch."""
    head = {"cluster": data.cluster, "node": data.node, "seq": data.seq, "sample_time": data.sample_time.isoformat()}
    return [{**head, "gpu": g} for g in data.gpus]
