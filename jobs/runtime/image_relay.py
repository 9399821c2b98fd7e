"""A loopback relay to the console's image registry that counts what it sends: a node's pull says how far it is
in bytes received, which neither the registry nor `podman pull` tells (jobs.runtime.node_images)."""

from __future__ import annotations

import asyncio
import contextlib

CHUNK = 1 << 16


class CountingRelay:
    def __init__(self, host: str, port: int):
        self._target = (host, port)
        self.sent = 0  # bytes from the registry to the node, over all connections
        self._pipes: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @classmethod
    async def start(cls, host: str, port: int) -> CountingRelay:
        """A relay to host:port, listening on a free loopback port of its own."""
        relay = cls(host, port)
        relay._server = await asyncio.start_server(relay._serve, "127.0.0.1", 0)
        return relay

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        except OSError:
            client_writer.close()
            return
        pipes = [asyncio.create_task(self._pipe(client_reader, upstream_writer, count=False)),
                 asyncio.create_task(self._pipe(upstream_reader, client_writer, count=True))]
        self._pipes.update(pipes)
        try:
            await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            self._pipes.difference_update(pipes)
            for writer in (client_writer, upstream_writer):
                writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, count: bool) -> None:
        try:
            while chunk := await reader.read(CHUNK):
                if count:
                    self.sent += len(chunk)
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                writer.write_eof()

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()
