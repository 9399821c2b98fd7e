"""The command that holds a node's lock on bringing an image (jobs.runtime.node_images.one_transfer_at_a_time), as a
fake node's SSH side starts it: it answers `answer` ("locked", or nothing when flock's wait ran out) and notes its
release in the node's commands."""

import asyncio
from types import SimpleNamespace


def lock_holder(commands: list[str], answer: str = "locked\n"):
    class Holder:
        stdout = SimpleNamespace(readline=lambda: asyncio.sleep(0, answer))
        stderr = SimpleNamespace(read=lambda size: asyncio.sleep(0, ""))
        stdin = SimpleNamespace(write_eof=lambda: commands.append("lock released"))

        def close(self):
            pass

        async def wait_closed(self):
            pass

    return Holder()
