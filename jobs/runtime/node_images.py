"""Engine images on nodes: a node that lacks a job's image pulls the layers it lacks from the console's registry
through its SSH connection (jobs.images.registry; real GPU sites are often air-gapped), or, where the console has
no registry or the node's SSH server forwards no port, gets the image's archive over SFTP; an image the console
holds in neither way (a registry image of the admin's) the node pulls from where its name says."""

import asyncio
import contextlib
import hashlib
import logging
import re
import secrets
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncssh
from django.conf import settings

from jobs.images import registry
from jobs.images.recipes import archive_name_of
from jobs.runtime.image_relay import CountingRelay
from jobs.runtime.ssh import NodeError, run_checked

logger = logging.getLogger(__name__)
IMAGE_ID = re.compile(r"[0-9a-f]{64}")
# Where a node keeps an image archive while it loads it.
NODE_IMAGE_CACHE = "/var/lib/training-console/image-cache"
# How often a copy of an image to a node says how far it is.
PROGRESS_SECONDS = 5.0
# How long a transfer of an image to a node waits for another one of the same image to that node to end before
# it goes on without it (one_transfer_at_a_time).
TRANSFER_WAIT_SECONDS = 900

Say = Callable[[str], Awaitable[None]]


def console_archive(reference: str) -> Path | None:
    archive = Path(settings.IMAGES_DIR) / archive_name_of(reference)
    return archive if archive.is_file() else None


async def has_image(connection: asyncssh.SSHClientConnection, reference: str) -> bool:
    result = await connection.run(shlex.join(["podman", "image", "exists", reference]), check=False,
                                  timeout=settings.SSH_COMMAND_TIMEOUT)
    return result.exit_status == 0


async def ensure_image(connection: asyncssh.SSHClientConnection, label: str, reference: str, say: Say,
                       cache: str = NODE_IMAGE_CACHE) -> None:
    """Make sure the node holds `reference`: copy and load the console's archive (into `cache` first: root's, or a
    folder of the user the console logs in as), or pull it; one transfer of an image to a node at a time."""
    if await has_image(connection, reference):
        return
    async with one_transfer_at_a_time(connection, label, reference, cache, say):
        # Brought meanwhile by the transfer this one waited for (a job's, or the start's prefetch).
        if not await has_image(connection, reference):
            await _bring(connection, label, reference, say, cache)


@contextlib.asynccontextmanager
async def one_transfer_at_a_time(connection: asyncssh.SSHClientConnection, label: str, reference: str, cache: str,
                                 say: Say) -> AsyncIterator[None]:
    """Hold the node's lock on bringing this image (a flock beside `cache`, held by a command of this connection and
    released when it ends, the connection's loss included), waiting, and saying so, while another holds it. A wait
    past TRANSFER_WAIT_SECONDS (a holder stuck on a session its console lost) goes on without the lock, as every
    transfer did before there was one: it costs a second transfer, never the job."""
    locks = f"{cache}.locks"
    await run_checked(connection, label, "making the image cache", ["mkdir", "-p", cache, locks])
    lock = f"{locks}/{hashlib.sha256(reference.encode()).hexdigest()[:16]}"
    step = f"waiting to bring {reference}"
    answer: asyncio.Future[str] | None = None
    try:
        holder = await connection.create_process(shlex.join(
            ["flock", "-w", str(TRANSFER_WAIT_SECONDS), lock, "sh", "-c", "echo locked && exec cat >/dev/null"]))
    except (asyncssh.Error, OSError) as error:
        raise NodeError(label, step, str(error)) from error
    try:
        answer = asyncio.ensure_future(holder.stdout.readline())
        if not (await asyncio.wait({answer}, timeout=1))[0]:
            await say(f"{label}: {reference} is being brought to it by another job: waiting for that")
        try:
            line = await asyncio.wait_for(answer, TRANSFER_WAIT_SECONDS + 30)
        except (asyncssh.Error, OSError, TimeoutError) as error:
            raise NodeError(label, step, str(error) or type(error).__name__) from error
        if line.strip() != "locked":
            await say(f"{label}: the other transfer of {reference} did not end within {TRANSFER_WAIT_SECONDS} s: "
                      "bringing it all the same")
        yield
    finally:
        if answer is not None and not answer.done():
            answer.cancel()
        holder.stdin.write_eof()
        holder.close()
        with contextlib.suppress(TimeoutError, asyncssh.Error, OSError, asyncio.CancelledError):
            await asyncio.wait_for(holder.wait_closed(), 10)


async def _bring(connection: asyncssh.SSHClientConnection, label: str, reference: str, say: Say, cache: str) -> None:
    digest = registry.pullable_digest(reference)
    if digest and settings.IMAGE_REGISTRY_PORT and await _registry_answers(settings.IMAGE_REGISTRY_PORT):
        try:
            await pull_from_console(connection, label, reference, digest, say)
            return
        except asyncssh.ChannelListenError as refused:
            await say(f"{label} forwards no port to the console's registry ({refused}): copying the archive")
        except NodeError as failed:
            if console_archive(reference) is None:
                raise
            # (A node's own registry policy, a proxy that takes loopback too: the archive needs none of them.)
            await say(f"{label} could not pull {reference} from the console's registry: copying the archive")
            logger.warning("%s", failed)
    archive = console_archive(reference)
    if archive is None:
        await say(f"{label} has no {reference}: pulling it")
        await run_checked(connection, label, f"pulling {reference}", ["podman", "pull", "--quiet", reference],
                          timeout=1800)
        return
    await copy_archive(connection, label, reference, archive, say, cache)


async def copy_archive(connection: asyncssh.SSHClientConnection, label: str, reference: str, archive: Path, say: Say,
                       cache: str) -> None:
    """Copy the image's whole archive into the node's `cache` over SFTP, saying how far it is, and load it."""
    size_mib = (await asyncio.to_thread(archive.stat)).st_size / 2**20
    await say(f"{label} has no {reference}: copying it from the console ({size_mib:,.0f} MiB)")
    # A name of this copy's own (one_transfer_at_a_time keeps one copy of an image at a time, not of two images).
    remote = f"{cache}/{archive.name}.{secrets.token_hex(8)}"
    started = time.monotonic()
    copied = [0]

    def note_progress(_source: bytes, _destination: bytes, done: int, _total: int) -> None:
        copied[0] = done

    async def tell_progress() -> None:
        # A copy of gigabytes takes minutes: the timeline says how far it is, not a silent wait.
        while True:
            await asyncio.sleep(PROGRESS_SECONDS)
            rate = copied[0] / 2**20 / (time.monotonic() - started)
            await say(f"{label}: {copied[0] / 2**20:,.0f} of {size_mib:,.0f} MiB of {reference} copied "
                      f"({rate:,.0f} MiB/s)")

    teller = asyncio.create_task(tell_progress())
    try:
        async with connection.start_sftp_client() as sftp:
            await sftp.put(str(archive), remote, progress_handler=note_progress)
    except (OSError, asyncssh.Error) as error:
        raise NodeError(label, f"copying {reference}", str(error)) from error
    finally:
        teller.cancel()
    await say(f"{label}: loading {reference} (copied in {time.monotonic() - started:.0f} s)")
    try:
        await run_checked(connection, label, f"loading {reference}", ["podman", "load", "--quiet", "--input", remote],
                          timeout=1800)
    finally:
        await connection.run(shlex.join(["rm", "-f", remote]), check=False)


async def _registry_answers(port: int) -> bool:
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


async def pull_from_console(connection: asyncssh.SSHClientConnection, label: str, reference: str, digest: str,
                            say: Say) -> None:
    """Pull the image by its digest from the console's registry, through a port the node's SSH server forwards to
    it for this pull alone, then give it its usual name. Only the layers the node lacks travel."""
    repository = registry.repository_of(reference)
    relay = await CountingRelay.start("127.0.0.1", settings.IMAGE_REGISTRY_PORT, registry.PULL_REQUEST)
    listener: asyncssh.SSHListener | None = None
    teller: asyncio.Task[None] | None = None
    started = time.monotonic()

    async def tell_progress() -> None:
        while True:
            await asyncio.sleep(PROGRESS_SECONDS)
            elapsed = time.monotonic() - started
            await say(f"{label}: {relay.sent / 2**20:,.0f} MiB of {reference} received "
                      f"({relay.sent / 2**20 / elapsed:,.0f} MiB/s)")

    try:
        listener = await connection.forward_remote_port("127.0.0.1", 0, "127.0.0.1", relay.port)
        source = f"127.0.0.1:{listener.get_port()}/{repository}@{digest}"
        await say(f"{label} has no {reference}: pulling the layers it lacks from the console's registry")
        teller = asyncio.create_task(tell_progress())
        # (No TLS: the bytes travel in the SSH session, and the digest pins every one of them.)
        output = await run_checked(connection, label, f"pulling {reference}",
                                   ["podman", "pull", "--quiet", "--tls-verify=false", source], timeout=1800)
    finally:
        if teller is not None:
            teller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await teller
        if listener is not None:
            listener.close()
            await listener.wait_closed()
        await relay.close()
    image_id = output.strip().splitlines()[-1] if output.strip() else ""
    if not IMAGE_ID.fullmatch(image_id):
        raise NodeError(label, f"pulling {reference}", f"podman pull named no image ({image_id[:80]!r})")
    await run_checked(connection, label, f"naming {reference}", ["podman", "tag", image_id, reference])
    # The name it was pulled by goes: it names a port that is closed now, and while it stayed, `podman rmi` of the
    # usual name would only untag the image and keep its layers.
    await connection.run(shlex.join(["podman", "untag", image_id, source]), check=False,
                         timeout=settings.SSH_COMMAND_TIMEOUT)
    said = f"{label}: {reference} pulled, {relay.sent / 2**20:,.0f} MiB received in {time.monotonic() - started:.0f} s"
    logger.info("%s", said)  # (the operator's log too: which nodes took images, and what it cost)
    await say(said)
