"""`whaleflux schemas`: the JSON Schema of every event, written to (or checked against) docs/events/."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .terminal import console, fail


def schemas(
    out: Annotated[Path | None, typer.Option(
        help="folder to write to; default the checkout's docs/events, wherever you are")] = None,
    check: Annotated[bool, typer.Option(help="only report stale files; exit 1 if any")] = False,
) -> None:
    """Write the JSON Schema of every event (docs/events/)."""
    from whaleflux.shared import schemas as event_schemas

    if out is None:
        # The checkout this CLI runs from (an editable install), not the current folder.
        out = Path(__file__).resolve().parents[2] / "docs" / "events"
        if not out.parent.is_dir():
            fail(f"no docs/ folder beside this installation ({out.parent.parent}); name one with --out")
    if check:
        stale = event_schemas.stale(out)
        if stale:
            fail(f"stale event schemas in {out}: {', '.join(stale)}; run `whaleflux schemas`")
        console.print(f"{out}: up to date")
        return
    for path in event_schemas.write(out):
        console.print(f"wrote {path}")
