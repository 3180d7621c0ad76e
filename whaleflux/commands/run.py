"""Commands that run WhaleFlux itself: `up` (everything locally), `service NAME` and `agent`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from whaleflux.shared.datafiles import DEFAULT_ASSETS, DEFAULT_FLEET

from .terminal import bad_option, fail

SERVICE_NAMES = ("telemetry", "scheduler", "alerting", "billing", "inventory", "console")


def up(
    fleet: Annotated[Path, typer.Option(help="fleet file to simulate")] = DEFAULT_FLEET,
    assets: Annotated[Path | None, typer.Option(
        help="declared ownership and leases; default: the demo fleet's")] = None,
    nats_cluster: Annotated[int, typer.Option(
        min=1, max=5, help="nats-servers to run as one JetStream cluster (3: R3 streams, survives losing one)")] = 1,
    production: Annotated[bool, typer.Option(
        "--production", help="the services in production mode: every read needs a token, as writes do "
        "(also with WHALEFLUX_ENVIRONMENT=production exported)")] = False,
) -> None:
    """Run everything locally: NATS, Redis, the five services and a simulated fleet."""
    from whaleflux.local import up as run_up

    if assets is None and fleet == DEFAULT_FLEET:
        assets = DEFAULT_ASSETS
    if not fleet.is_file():
        bad_option("--fleet", str(fleet), "no such fleet file (e.g. shared/data/fleets/small-demo.yaml)")
    if assets is not None and not assets.is_file():
        bad_option("--assets", str(assets), "no such assets file")
    if nats_cluster == 2:
        fail("--nats-cluster 2 cannot lose a server (a JetStream cluster needs a majority): use 3 or 5")
    production = production or os.environ.get("WHALEFLUX_ENVIRONMENT") == "production"
    raise typer.Exit(run_up(fleet, assets, nats_cluster, production=production))


def service(
    name: Annotated[str, typer.Argument(help="telemetry | scheduler | alerting | billing | inventory | console")],
) -> None:
    """Run one service in the foreground (settings from WHALEFLUX_* environment variables)."""
    if name not in SERVICE_NAMES:
        fail(f"unknown service {name!r}; choose one of {', '.join(SERVICE_NAMES)}")
    import importlib

    serve_on_handed_socket()
    importlib.import_module(f"whaleflux.{name}.app").main()


def serve_on_handed_socket() -> None:
    """Serve HTTP on the listening socket `whaleflux up` bound and handed over (WHALEFLUX_HTTP_FD), if any.

    `up` binds each port itself and passes the socket to the process it starts: no moment in which another
    process can take the port, and a restarted service keeps its port. uvicorn serves an inherited socket
    with `fd=`; the service shell has no setting for it, so this makes it uvicorn's default, in this process.
    """
    fd = os.environ.get("WHALEFLUX_HTTP_FD")
    if not fd:
        return
    import uvicorn.config

    init = uvicorn.config.Config.__init__

    def with_fd(self: uvicorn.config.Config, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("fd") is None:  # uvicorn.run passes fd=None explicitly
            kwargs["fd"] = int(fd)
        init(self, *args, **kwargs)

    uvicorn.config.Config.__init__ = with_fd  # type: ignore[method-assign]


def agent(
    simulate: Annotated[Path, typer.Option(help="fleet file whose nodes to simulate")] = DEFAULT_FLEET,
    node: Annotated[list[str] | None, typer.Option(help="node(s) of the fleet to run; default all")] = None,
    nvml: Annotated[bool, typer.Option(
        help="this machine's real GPUs through NVML (node name: WHALEFLUX_NODE_NAME or the hostname)")] = False,
) -> None:
    """Run a node agent: simulated GPUs from a fleet file, or --nvml on a real GPU node."""
    from whaleflux.agent.app import main as agent_main

    if not nvml and not simulate.is_file():
        bad_option("--simulate", str(simulate), "no such fleet file (e.g. shared/data/fleets/small-demo.yaml)")
    if node and not nvml:
        from whaleflux.agent.app import select_nodes

        try:
            select_nodes(simulate, node)
        except SystemExit as exc:
            bad_option("--node", ",".join(node), str(exc.code))
    serve_on_handed_socket()
    agent_main(simulate, node, nvml)
