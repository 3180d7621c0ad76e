"""What every command prints through: the console, tables, and the one-line error that ends a command."""

from __future__ import annotations

import sys
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
