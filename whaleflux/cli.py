"""`whaleflux`: one command line for the whole system. The commands live in whaleflux/commands/, one module per
group (start-up stays light: see that package's docstring); this module puts them on one app."""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from .commands import (
    alerts,
    costs,
    fleet,
    gpus,
    inventory,
    jobs,
    nodes,
    run,
    schemas,
    simulation,
    size,
    submit,
    testgpu,
    tokens,
)


class WhaleFluxGroup(TyperGroup):
    """The app's root command: a value refused by its option's type (typer checks types with pydantic) is said in
    the user's words, "Invalid value for '--hours': expected a number (got 'foo')", not pydantic's."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except typer.BadParameter as exc:
            errors = getattr(exc.__cause__, "errors", None)
            if callable(errors) and (found := errors()):
                from whaleflux.client import expected_words

                words, shown = expected_words(found[0]), found[0].get("input")
                exc.message = words + (f" (got {shown!r})" if isinstance(shown, str) and repr(shown) not in words
                                       else "")
            raise


app = typer.Typer(help="WhaleFlux: GPU fleet manager.", no_args_is_help=True, pretty_exceptions_enable=False,
                  cls=WhaleFluxGroup)

app.command()(run.up)
app.command()(run.service)
app.command()(run.agent)
app.command()(fleet.monitor)
app.add_typer(fleet.sim_app, name="sim")
app.command()(submit.submit)
app.add_typer(jobs.jobs_app, name="jobs")
app.add_typer(nodes.nodes_app, name="nodes")
app.add_typer(gpus.gpus_app, name="gpus")
app.add_typer(costs.costs_app, name="costs")
app.add_typer(simulation.trace_app, name="trace")
app.command()(simulation.simulate)
app.add_typer(alerts.alerts_app, name="alerts")
app.command()(inventory.inventory)
app.command()(inventory.leases)
app.command()(inventory.findings)
app.command()(schemas.schemas)
app.command()(size.size)
app.command("test-gpu")(testgpu.test_gpu)
app.add_typer(tokens.tokens_app, name="tokens")


def main() -> None:
    """The `whaleflux` entry point: the app, with a hint where a usage error has a likely cause."""
    try:
        app()
    except SystemExit as exc:
        argv = sys.argv[1:]
        if exc.code == 2 and argv[:1] == ["submit"] and "--" not in argv:
            # `submit python -c ...`: the job's own options were read as whaleflux's (usage errors exit 2).
            Console(stderr=True).print("hint: put the job's command after `--`, e.g. "
                                       "whaleflux submit --gpus 1 -- python -c \"print('hi')\"", soft_wrap=True,
                                       markup=False, highlight=False)
        raise
