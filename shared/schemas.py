"""JSON Schema of every event, as committed under docs/events/ for other systems to use."""

from __future__ import annotations

import json
from pathlib import Path

from .events import EVENT_MODELS, Envelope


def render() -> dict[str, str]:
    """File name -> JSON text, for the envelope and each event's data."""
    files = {"envelope.json": Envelope.model_json_schema()}
    for model in EVENT_MODELS:
        schema = model.model_json_schema()
        schema["$id"] = model.event_type()
        schema["description"] = (model.__doc__ or "").strip().splitlines()[0] if model.__doc__ else model.event_name
        files[f"{model.event_name}.v{model.version}.json"] = schema
    return {name: json.dumps(doc, indent=2, sort_keys=True) + "\n" for name, doc in files.items()}


def write(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render().items():
        path = out / name
        path.write_text(text)
        written.append(path)
    return written


def stale(out: Path) -> list[str]:
    """Names of schema files under `out` that differ from the code (or are missing or extra)."""
    want = render()
    have = {p.name: p.read_text() for p in out.glob("*.json")} if out.exists() else {}
    return sorted(n for n in set(want) | set(have) if want.get(n) != have.get(n))
