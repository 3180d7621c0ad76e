"""A fleet of more than 1,000 nodes: the server's default consumer limit must not stop the agents."""

from __future__ import annotations

import asyncio

from whaleflux.shared.streams import STREAMS, agent_consumer

from .processes import connect_bus

NODES = 1100  # each node agent has its own durable consumer on the jobs stream


def test_the_jobs_stream_takes_a_consumer_per_node_beyond_the_servers_default_of_1000(clean_servers):
    async def scenario() -> int:
        bus = await connect_bus(clean_servers)
        try:
            await bus.ensure_streams()  # twice: an existing stream is updated to the same limits
            for i in range(NODES):
                await bus.ensure_consumer(agent_consumer("onprem", f"node-{i:04d}"))
            return (await bus.js.stream_info("WHALEFLUX_JOBS")).state.consumer_count
        finally:
            await bus.close()

    consumers = asyncio.run(scenario())
    assert consumers is not None and consumers >= NODES
    limit = STREAMS["WHALEFLUX_JOBS"].config().max_consumers
    assert limit is not None and limit >= 100_000
