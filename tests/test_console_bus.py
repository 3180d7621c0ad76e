"""The console on a real bus: a burst of messages does not hold its event loop (pages wait behind it)."""

from __future__ import annotations

import asyncio
import time

from whaleflux.console.live import LiveHub

from .processes import connect_bus

BURST = 400
TAP_S = 0.001  # what one message costs the tap here (the fleet's fold of one node's telemetry is about 0.1 ms)


def test_a_burst_on_the_bus_is_folded_in_slices_that_let_the_event_loop_serve_others(clean_servers):
    async def scenario() -> tuple[int, int]:
        hub = LiveHub()
        tapped: list[int] = []
        stretches: list[int] = []  # messages tapped between two turns of another task

        def tap(raw: bytes, subject: str) -> None:
            tapped.append(len(raw))
            end = time.perf_counter() + TAP_S
            while time.perf_counter() < end:  # CPU, as a fold is: the loop runs nothing else meanwhile
                pass

        hub.taps["gpu.telemetry."] = tap
        await hub.connect(clean_servers.nats_url, clean_servers.nats_user, clean_servers.nats_password)
        bus = await connect_bus(clean_servers)
        try:
            assert hub.nc is not None
            await hub.nc.flush()
            for i in range(BURST):
                await bus.nc.publish(f"gpu.telemetry.c.n{i}", b"x" * 200)
            await bus.nc.flush()
            time.sleep(0.3)  # noqa: ASYNC251 - the loop held on purpose: the burst waits in the socket, as under load

            async def other() -> None:  # another task of the loop: a page request, a view's build
                seen = 0
                while len(tapped) < BURST:
                    await asyncio.sleep(0)
                    stretches.append(len(tapped) - seen)
                    seen = len(tapped)

            await asyncio.wait_for(other(), 60)
            return len(tapped), max(stretches)
        finally:
            await bus.close()
            await hub.close()

    tapped, longest = asyncio.run(scenario())
    assert tapped == BURST
    # Folded in slices of about 2 ms: the other task got a turn after every few messages, not after the burst
    # (before, nats-py's callback folded everything that had arrived in one step of the loop).
    assert longest <= 20, f"{longest} messages were folded without letting the loop run anything else"
