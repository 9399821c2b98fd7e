"""A remote command's output over SSH, held in a bounded buffer however fast the command prints.

asyncssh's stream readers pause the channel when their buffer is full, but the channel reopens the
SSH window to its full size whenever it hands over data it had buffered, so with a reader slower than
the remote (the database behind the log), what waits in memory grows with everything printed. Here the
channel is paused at a high-water mark and resumed only once the buffer has drained far enough to take
everything the channel may hold (one window) in one go: the window is then reopened only when nothing
waits in the channel, and memory stays within about three windows plus one.
"""

import asyncio
from collections import deque

import asyncssh

STDOUT, STDERR = None, asyncssh.EXTENDED_DATA_STDERR


class BoundedOutput(asyncssh.SSHClientSession):
    """Collects a command's stdout and stderr, in arrival order, for one consumer calling read()."""

    def __init__(self) -> None:
        self.chunks: deque[tuple[str, object]] = deque()
        self.size = 0
        self.paused = False
        self.closed = False
        self.arrived = asyncio.Event()
        self.channel: asyncssh.SSHClientChannel | None = None
        self.low = self.high = 0

    def connection_made(self, chan: asyncssh.SSHClientChannel) -> None:
        self.channel = chan
        window = chan.get_recv_window()
        self.low, self.high = window, 3 * window

    def data_received(self, data: str, datatype) -> None:
        self.chunks.append((data, datatype))
        self.size += len(data)
        if not self.paused and self.size >= self.high:
            self.paused = True
            assert self.channel is not None, "asyncssh hands over data only after connection_made"
            self.channel.pause_reading()
        self.arrived.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.arrived.set()

    async def read(self) -> tuple[str, object] | None:
        """The next chunk and whether it is stdout (STDOUT) or stderr (STDERR); None once the channel closed."""
        while not self.chunks:
            if self.closed:
                return None
            self.arrived.clear()
            await self.arrived.wait()
        data, datatype = self.chunks.popleft()
        self.size -= len(data)
        if self.paused and self.size <= self.low:
            self.paused = False
            assert self.channel is not None, "only data_received pauses, and data comes after connection_made"
            self.channel.resume_reading()  # hands over what the channel held, at most one window
        return data, datatype
