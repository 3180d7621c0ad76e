"""What every command prints through: the console, tables, and the one-line error that ends a command."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

# Piped output (scripts, logs) gets wide rows instead of wrapped cells.
console = Console(width=None if sys.stdout.isatty() else 200)


def print_table(table: Table, empty: str) -> None:
    """The table, or a line saying there is nothing to show (an empty table prints nothing at all)."""
    console.print(table if table.row_count else empty)


def fail(message: str) -> NoReturn:
    """End the command with exit code 1 and one line saying why."""
    # One line whatever its length; brackets in the message are text, not markup.
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    raise typer.Exit(1)


def bad_option(flag: str, value: object, why: str) -> NoReturn:
    """End the command as a usage error (exit code 2) naming the option, the value given and what it takes."""
    console.print(f"[red]error:[/red] {escape(f'{flag} {value!r}: {why}')}", soft_wrap=True)
    raise typer.Exit(2)


def one_of(flag: str, value: str | None, allowed: Iterable[str]) -> str | None:
    """`value` if it is one of `allowed` (or None: the option not given); else the usage error listing them."""
    allowed = list(allowed)
    if value is not None and value not in allowed:
        bad_option(flag, value, f"choose one of {', '.join(allowed)}")
    return value


def instant(flag: str, value: str | None) -> str | None:
    """A date or date and time as the user wrote it (UTC unless it says otherwise) as ISO 8601 with its offset, for
    a service; a usage error with the formats and an example for anything else."""
    from whaleflux.client import DATE_FORMATS

    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        bad_option(flag, value, f"expected {DATE_FORMATS}")
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).isoformat().replace("+00:00", "Z")


def amount(flag: str, value: str | None) -> str | None:
    """A sum of money or a rate as the user wrote it (e.g. 2.5), if it is a number of 0 or more."""
    from decimal import Decimal, InvalidOperation

    if value is None:
        return None
    try:
        number = Decimal(value)
    except InvalidOperation:
        number = Decimal("NaN")
    if not number.is_finite() or number < 0:
        bad_option(flag, value, "expected a number of 0 or more, e.g. 2.5")
    return value


def above(flag: str, value: float, floor: float, inclusive: bool = False) -> float:
    """`value` if it is a finite number above `floor` (or equal, if `inclusive`); else the usage error."""
    import math

    if not math.isfinite(value) or value < floor or (value == floor and not inclusive):
        bad_option(flag, f"{value:g}", f"expected a number {'of' if inclusive else 'above'} {floor:g}"
                   + (" or more" if inclusive else ""))
    return value


def gpu_choice(flag: str, value: str) -> str:
    """A GPU as the user names one: "all", an index on the node, or a UUID (or its start, GPU-...)."""
    if not (value == "all" or value.isdigit() or value.upper().startswith("GPU-")):
        bad_option(flag, value, "expected all, a GPU index (e.g. 0) or a GPU UUID (e.g. GPU-5a1c...)")
    return value


def gpu_model(flag: str, name: str) -> str:
    """The catalogue key for a model named in any case or by its device name ("h100", "RTX 4090")."""
    from whaleflux.shared.catalog import gpu_models

    catalogue = gpu_models()
    wanted = name.strip().lower()
    for key, spec in catalogue.items():
        if wanted == key.lower() or wanted in (n.lower() for n in spec.names):
            return key
    bad_option(flag, name, f"unknown GPU model; choose one of {', '.join(sorted(catalogue))}")
