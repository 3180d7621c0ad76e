"""`whaleflux tokens issue|list|revoke`: API tokens with roles in the tokens file the services read (hashed, 0600).

The file is `WHALEFLUX_TOKENS_FILE`, else `WHALEFLUX_HOME/secrets/tokens.json` (the one `whaleflux up` gives its
services). Roles and what each may do: docs/security.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .terminal import console, fail, print_table

tokens_app = typer.Typer(help="API tokens with roles (viewer, submitter, operator, admin) for people and systems.",
                         no_args_is_help=True)
ROLE_NAMES = ("viewer", "submitter", "operator", "admin")  # shared.access.ROLES, without importing pydantic here


def tokens_path() -> Path:
    from whaleflux.shared.localconfig import home

    return Path(os.environ.get("WHALEFLUX_TOKENS_FILE") or home() / "secrets" / "tokens.json")


@tokens_app.command("issue")
def issue(
    name: Annotated[str, typer.Option(help="who the token is for (a person, a pipeline); re-issuing replaces it")],
    role: Annotated[str, typer.Option(help="viewer | submitter | operator | admin")] = "viewer",
    team: Annotated[list[str] | None, typer.Option(help="a submitter's team (repeat for several)")] = None,
    service: Annotated[list[str] | None, typer.Option(help="only this service accepts it (repeatable)")] = None,
) -> None:
    """Issue a token and print it (once: the file keeps only its hash)."""
    from whaleflux.shared import access

    if role not in ROLE_NAMES:
        fail(f"--role {role!r}: choose {', '.join(ROLE_NAMES)}")
    path = tokens_path()
    try:
        token = access.issue(path, name, role, teams=team, services=service)  # type: ignore[arg-type]
    except (ValueError, access.Refused) as exc:
        fail(str(exc))
    console.print(f"issued a {role} token for {name} in {path}:", highlight=False)
    print(token)  # alone on its line, for scripts: `whaleflux tokens issue ... | tail -1`


@tokens_app.command("list")
def list_tokens() -> None:
    """The tokens in the file: name, role, teams, services (never the tokens)."""
    from whaleflux.shared import access

    try:
        found = access.read_tokens(tokens_path()).tokens
    except access.Refused as exc:
        fail(str(exc))
    table = Table("name", "role", "teams", "accepted by")
    for entry in found:
        table.add_row(entry.name, entry.role, ", ".join(entry.teams or []) or "—",
                      ", ".join(entry.services or []) or "every service")
    print_table(table, f"no tokens in {tokens_path()}")


@tokens_app.command("revoke")
def revoke(name: Annotated[str, typer.Argument(help="the token's name")]) -> None:
    """Remove a token: the services refuse it from their next request."""
    from whaleflux.shared import access

    try:
        removed = access.revoke(tokens_path(), name)
    except access.Refused as exc:
        fail(str(exc))
    if not removed:
        fail(f"no token named {name!r} in {tokens_path()}")
    console.print(f"revoked {name}")
