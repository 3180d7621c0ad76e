"""Malformed input generated from the services' own contracts: bus messages from each event model's JSON Schema,
hostile YAML for the upload endpoints (HTTP requests come from schemathesis: tests/fuzz_http.py).

Seeded (`random.Random`), so a failure is reproduced by its seed; used by tests/test_fuzz*.py (a few
examples per route and subject) and bench/fuzz.py (thousands).
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass, field
from typing import Any

TOKEN = "fuzz-admin-token-" + "x" * 24
# Routes that take a YAML document as their body (not in their OpenAPI: they read the raw body).
UPLOADS = {"inventory": ("PUT", "/admin/assets"), "billing": ("PUT", "/admin/pricebook")}

NASTY_STRINGS = ["", " ", "\x00", "a\x00b", "%00", "../../etc/passwd", "..%2f..%2f", "NaN", "Infinity", "-1",
                 "1e999", "99999999999999999999999999", "null", "true", "[]", "{}", "'; DROP TABLE x; --",
                 "<script>", "💥" * 3, "\ud7ff", "\u202e", "a" * 5000, "*", ">", "a.b", "a b", "\n", "\\",
                 "2026-13-45T99:99:99Z", "0x10", "+1", "٣", "\ufeff", "$(id)", "`id`",
                 # regular expressions Python's re cannot compile without RecursionError / OverflowError
                 "(" * 1000 + ")" * 1000, "a{4294967296}", 'alertname=~"' + "(" * 1000 + ")" * 1000 + '"',
                 'alertname=~"a{4294967296}"']
NASTY_NUMBERS: list[Any] = [-1, 0, 2**31, 2**53 + 1, 2**64, 2**70, -(2**70), 1e308, -1e308, 1e-320, 0.5, -0.0]
NASTY_VALUES: list[Any] = [None, True, False, [], {}, [[[]]], {"a": {"b": {}}}, "x", 1, 1.5, [1, "a", None]]
# Raw JSON texts Python's json module would write for no value: JSON has no NaN or Infinity.
RAW_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1" * 400]


def resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        node: Any = spec
        for part in schema["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def example(schema: dict[str, Any], spec: dict[str, Any], depth: int = 0) -> Any:
    """A plausible value for `schema` (valid where it is easy to be), to mutate."""
    schema = resolve(schema, spec)
    if depth > 6:
        return None
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [s for s in schema[key] if resolve(s, spec).get("type") != "null"] or schema[key]
            return example(options[0], spec, depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "default" in schema and schema["default"] is not None:
        return schema["default"]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        return {k: example(v, spec, depth + 1) for k, v in props.items() if k in schema.get("required", props)}
    if kind == "array":
        return [example(schema.get("items", {}), spec, depth + 1)] * max(1, schema.get("minItems", 1))
    if kind == "integer":
        return int(schema.get("minimum", schema.get("exclusiveMinimum", 0)) + 1)
    if kind == "number":
        return float(schema.get("minimum", 0)) + 1.5
    if kind == "boolean":
        return True
    if kind == "string":
        if schema.get("format") == "date-time":
            return "2026-01-01T00:00:00Z"
        if schema.get("format") == "date":
            return "2026-01-01"
        digits = schema.get("pattern", "").startswith("^\\d")
        return ("1" if digits else "a") * max(1, schema.get("minLength", 1))
    return "x"


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into `value` (dict keys and list indices), the root included."""
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _leaves(v, (*path, i))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return doc


def _nasty(rng: random.Random) -> Any:
    pool = rng.choice([NASTY_STRINGS, NASTY_NUMBERS, NASTY_VALUES])
    return json.loads(json.dumps(rng.choice(pool)))  # a copy: the document it goes into is changed further


# ---------------------------------------------------------------------------------------------- hostile YAML

def _laughs(rng: random.Random) -> bytes:
    levels, width = rng.randint(6, 12), rng.randint(5, 10)
    lines = ["a0: &a0 [" + ",".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines).encode()


HOSTILE_YAML = [
    _laughs,
    lambda rng: b"a: &a [*a]\n" if rng.random() < 0.5 else b"a: &a {<<: *a, b: *a}\n",
    lambda rng: b"[" * rng.choice([100, 1000, 10_000]),
    lambda rng: b"a:\n" + b"".join(b"  " * i + b"b:\n" for i in range(1, rng.choice([70, 500]))),
    lambda rng: rng.choice([b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff", b"\xff\xfe", b"\xfe\xff"]) +
    "assets: []\n".encode("utf-16-le"),
    lambda rng: b"assets: [\xff\xfe\xfd]\n",
    lambda rng: b"assets: \x00\x07\x1b\n",
    lambda rng: b"? [a, b]\n: 1\n",
    lambda rng: b"!!python/object/apply:os.system ['id']\n",
    lambda rng: b"a: !!binary " + b"A" * rng.randrange(1, 50) + b"\n",
    lambda rng: b"a: " + rng.choice([b".nan", b".inf", b"-.inf", b"1e999", b"9" * 500]) + b"\n",
    lambda rng: b"- a\n- b\n" if rng.random() < 0.5 else b"just a string",
    lambda rng: b"a: 1\n---\nb: 2\n",
    lambda rng: b"assets:\n  - node: " + rng.choice(NASTY_STRINGS).encode("utf-8", "surrogatepass") + b"\n",
    lambda rng: rng.randbytes(rng.randrange(1, 200)),
    lambda rng: b"contracts: " + json.dumps([{"id": _nasty(rng), "monthly_price_per_gpu": _nasty(rng)}]).encode(),
    lambda rng: b"prices: " + json.dumps([{"model": "A100", "ownership": "cloud", "price": _nasty(rng)}]).encode(),
    lambda rng: b"a: " + b"x" * (5 * 1024 * 1024),
]


def hostile_yaml(rng: random.Random) -> bytes:
    return rng.choice(HOSTILE_YAML)(rng)


# ---------------------------------------------------------------------------------------------- bus messages

def malformed_events(valid_envelope: dict[str, Any], rng: random.Random) -> bytes:
    """A message that can never be a valid event (each kind of damage is invalid whatever the event type)."""
    doc = json.loads(json.dumps(valid_envelope))
    kind = rng.randrange(12)
    data = doc["data"]
    if kind == 0:
        return rng.choice([b"", b"{", b"\xff\xfe{}", b"\x00not json", b"\x80" + rng.randbytes(rng.randrange(1, 100)),
                           b"[" * 50_000, json.dumps(doc).encode()[: rng.randrange(1, 40)]])
    if kind == 1:
        doc.pop(rng.choice(["specversion", "id", "source", "type", "time", "data"]))
    elif kind == 2:
        name = rng.choice(["specversion", "time", "id"])
        wrong: dict[str, list[Any]] = {"specversion": ["0.3", "", 1.0, None], "id": ["", None, 5, [], "x" * 200],
                                       "time": ["not-a-time", "", None, [], "2026-01-01T00:00:00"]}
        doc[name] = rng.choice(wrong[name])
    elif kind == 3:
        doc["type"] = rng.choice(["io.whaleflux.nope.v1", doc["type"].replace(".v1", ".v9"), ""])
    elif kind == 4:
        doc["data"] = rng.choice([None, [], "x", 1, [data]])
    elif kind == 5:
        data[rng.choice(["extra", "__proto__", "x" * 200])] = _nasty(rng)
    elif kind == 6 and data:  # an object where no event field takes one with an object inside
        data[rng.choice(sorted(data))] = {"a": {"b": {}}}
    elif kind == 7:
        return _raw_number_in(doc, rng)
    elif kind == 8:
        doc[rng.choice(["Bad_Name", "data_base64", "x" * 30])] = "v"
    elif kind == 9:
        doc["datacontenttype"] = rng.choice(["text/plain", "application/xml", "", "image/png"])
    elif kind == 10:
        doc[rng.choice(["ext", "traceparent"])] = rng.choice([[1], {"a": 1}, 2**40, 1.5])
    else:
        doc["data"] = {"__never__": data}
    return json.dumps(doc).encode()


def _never_valid(doc: dict[str, Any]) -> bytes:
    doc["data"]["__unknown_field__"] = 1  # every event model forbids unknown fields
    return json.dumps(doc).encode()


def _raw_number_in(doc: dict[str, Any], rng: random.Random) -> bytes:
    """A number field of `data` set to NaN, Infinity or beyond a double; without one, an unknown field."""
    numbers = [p for p in _leaves(doc["data"]) if p and isinstance(_get(doc["data"], p), (int, float))
               and not isinstance(_get(doc["data"], p), bool)]
    if not numbers:
        return _never_valid(doc)
    marker = "__FUZZ_NUMBER__"
    _set(doc["data"], rng.choice(numbers), marker)
    return json.dumps(doc).replace(f'"{marker}"', rng.choice(RAW_NUMBERS[:5])).encode()


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


@dataclass
class Tally:
    """What a fuzz run got back, per route (or subject)."""

    by_route: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def count(self, route: str, outcome: str) -> None:
        counts = self.by_route.setdefault(route, {})
        counts[outcome] = counts.get(outcome, 0) + 1

    def total(self, outcome: str) -> int:
        return sum(c.get(outcome, 0) for c in self.by_route.values())


def outcome_of(status: int) -> str:
    return "5xx" if status >= 500 else "4xx" if status >= 400 else "2xx/3xx"


def printable(text: str) -> str:
    return "".join(c if c in string.printable and c not in "\r\x0b\x0c" else f"\\x{ord(c):02x}" for c in text)[:300]
