"""A TCP proxy in front of NATS that can hold what its clients send and drop it, for fault tests: a process
killed while held dies with its acks unsent, at a point the test chooses (a real network fault, real servers)."""

from __future__ import annotations

import asyncio
import threading
import time


class HoldingProxy:
    """A TCP proxy in front of NATS that can hold what its clients send (their acks among it) and drop it: a
    process killed while held dies with its acks unsent, at a point the test chooses."""

    def __init__(self, target_url: str):
        host_port = target_url.split("//", 1)[1]
        self.target = (host_port.rsplit(":", 1)[0], int(host_port.rsplit(":", 1)[1]))
        self.held: asyncio.Event | None = None
        self.loop = asyncio.new_event_loop()
        self.writers: list[asyncio.StreamWriter] = []
        started = threading.Event()
        threading.Thread(target=self._run, args=(started,), daemon=True).start()
        assert started.wait(10)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.open = asyncio.Event()
        self.open.set()
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, gated: bool) -> None:
            while data := await src.read(65536):
                if gated:
                    await self.open.wait()
                dst.write(data)
                await dst.drain()
            dst.close()
        await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False),
                             return_exceptions=True)

    def hold(self) -> None:
        """From now on nothing a client sends reaches NATS (it waits here)."""
        self.loop.call_soon_threadsafe(self.open.clear)

    def release(self) -> None:
        self.loop.call_soon_threadsafe(self.open.set)

    def drop(self) -> None:
        """Close every connection, discarding what was held; new connections pass."""
        def close() -> None:
            for w in self.writers:
                w.transport.abort()
            self.writers.clear()
        self.loop.call_soon_threadsafe(close)
        time.sleep(0.2)
        self.release()

    def close(self) -> None:
        self.drop()
        self.loop.call_soon_threadsafe(self.loop.stop)
