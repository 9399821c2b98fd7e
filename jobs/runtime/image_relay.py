"""A loopback relay between a node's pull and the console's image registry (jobs.runtime.node_images).

It counts what it sends, so that a node's pull says how far it is in bytes received, which neither the registry
nor `podman pull` tells. And it passes only what a pull asks: the port the node forwards to it is on the node's
loopback, where the node's other processes (a job's container shares the node's network) reach it too, so each
request is held to the pattern given (GET or HEAD of the registry's ping, or of a manifest or blob by digest of
the console's images, with no body) and the connection is closed on anything else; a few connections at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import re

CHUNK = 1 << 16
# A pull opens a handful (podman fetches up to 6 layers at once); more is someone else's.
MAX_CONNECTIONS = 16
MAX_REQUEST_HEAD = 16 * 1024
BODY_HEADERS = re.compile(rb"\r\n(content-length:\s*[1-9]|transfer-encoding:)", re.IGNORECASE)


class CountingRelay:
    def __init__(self, host: str, port: int, allowed: re.Pattern[bytes]):
        self._target = (host, port)
        self._allowed = allowed
        self.sent = 0  # bytes from the registry to the node, over all connections
        self.refused = 0  # requests closed for not being a pull's
        self._pipes: set[asyncio.Task[None]] = set()
        self._open = 0
        self._server: asyncio.Server | None = None

    @classmethod
    async def start(cls, host: str, port: int, allowed: re.Pattern[bytes]) -> CountingRelay:
        """A relay to host:port for the requests `allowed` matches, on a free loopback port of its own."""
        relay = cls(host, port, allowed)
        relay._server = await asyncio.start_server(relay._serve, "127.0.0.1", 0, limit=MAX_REQUEST_HEAD)
        return relay

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:
            client_writer.close()
            return
        self._open += 1
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        except OSError:
            self._open -= 1
            client_writer.close()
            return
        pipes = [asyncio.create_task(self._requests(client_reader, upstream_writer, client_writer)),
                 asyncio.create_task(self._answers(upstream_reader, client_writer))]
        self._pipes.update(pipes)
        try:
            await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            self._pipes.difference_update(pipes)
            self._open -= 1
            for writer in (client_writer, upstream_writer):
                writer.close()

    async def _requests(self, reader: asyncio.StreamReader, upstream: asyncio.StreamWriter,
                        client: asyncio.StreamWriter) -> None:
        """Pass the client's requests one head at a time, each checked; end both ways at the first that is not."""
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    break  # the client is done
                except asyncio.LimitOverrunError:
                    self.refused += 1
                    break
                if not self._allowed.match(head) or BODY_HEADERS.search(head):
                    self.refused += 1
                    break
                upstream.write(head)
                await upstream.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            for writer in (upstream, client):
                writer.close()

    async def _answers(self, reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(CHUNK):
                self.sent += len(chunk)
                client.write(chunk)
                await client.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                client.write_eof()

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()
