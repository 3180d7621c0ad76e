"""The node agent process: one or more (simulated) nodes on one NATS connection."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import structlog
from pydantic import Field

from whaleflux.shared.bus import Bus
from whaleflux.shared.catalog import DEFAULT_FLEET, gpu_models, load_fleet
from whaleflux.shared.localconfig import home
from whaleflux.shared.logs import configure_logging
from whaleflux.shared.settings import CommonSettings

from .node import NodeAgent
from .simulated import SimulatedNode

log = structlog.get_logger("whaleflux.agent")


class AgentSettings(CommonSettings):
    interval_s: float = Field(1.0, ge=0.1, le=60)
    seed: int = 0


async def run_simulated(settings: AgentSettings, fleet_path: Path = DEFAULT_FLEET, node_names: list[str] | None = None) -> None:
    """Simulate the named nodes of a fleet file (all of them when none are named) until signalled."""
    fleet = load_fleet(fleet_path)
    nodes = fleet.nodes()
    if node_names:
        unknown = sorted(set(node_names) - {n.name for n in nodes})
        if unknown:
            raise SystemExit(f"{fleet_path}: no node(s) named {', '.join(unknown)}; fleet has {', '.join(n.name for n in nodes)}")
        nodes = [n for n in nodes if n.name in node_names]
    models = gpu_models()

    bus = None
    delay = 0.2
    while bus is None:
        try:
            bus = await Bus.connect(
                settings.nats_url,
                source=f"whaleflux/agent/{settings.instance}",
                user=settings.nats_user,
                password=settings.secret("nats_password"),
            )
            await bus.ensure_streams()
        except Exception as exc:
            if bus is not None:
                await bus.close()
                bus = None
            log.warning("agent.waiting_for_nats", error=repr(exc), retry_in_s=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    agents = [
        NodeAgent(
            bus,
            node,
            SimulatedNode(node.name, models[node.gpu_model], node.gpus, seed=settings.seed),
            interval_s=settings.interval_s,
            log_dir=home() / "jobs",
        )
        for node in nodes
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    for agent in agents:
        await agent.start()
    await stop.wait()
    log.info("agent.stopping")
    await asyncio.gather(*(a.stop() for a in agents))
    await bus.close()


def main(fleet: Path = DEFAULT_FLEET, nodes: list[str] | None = None) -> None:
    settings = AgentSettings()
    configure_logging("agent", settings.log_level)
    asyncio.run(run_simulated(settings, fleet, nodes))
