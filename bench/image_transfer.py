"""How long a node that lacks a job's engine image waits for it, beside the load alone, and against a
stream of the archive straight into `podman load`.

Brings up its own console (database, Redis, a local cluster of 1 node on bridge tcimgbr, 10.92.0.0/24)
and, taking turns, removes the image from the node and brings it back:

- the console: jobs.runtime.node_images.ensure_image, the archive copied to the node over SFTP (asyncssh's
  parallel requests) with its progress said every few seconds, then `podman load --input`;
- streamed: the archive written into `podman load`'s standard input over one SSH channel (no copy on the
  node's disk first; podman keeps what it reads in a temporary file anyway);
- the floor: `podman load --input` of the archive where it lies (the local node shares this machine's
  files), no transfer at all.

    .venv/bin/python bench/image_transfer.py [--image mpi|horovod|mindspore] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import time

import benchkit

VAR = benchkit.environment("images", subnet="10.92.0.0/24", bridge="tcimgbr", prefix="tcimg")


async def remove(connection, reference: str) -> None:
    await connection.run(shlex.join(["podman", "rmi", "--force", reference]), check=False)


async def streamed(connection, archive) -> None:
    process = await connection.create_process(shlex.join(["podman", "load", "--quiet"]), encoding=None)
    with archive.open("rb") as source:
        while chunk := source.read(4 * 2**20):
            process.stdin.write(chunk)
            await process.stdin.drain()
    process.stdin.write_eof()
    result = await process.wait()
    assert result.exit_status == 0, result.stderr


async def measure(node, reference: str, archive, rounds: int) -> dict[str, list[float]]:
    from jobs.runtime.node_images import ensure_image, has_image
    from jobs.runtime.ssh import connect, run_checked

    target = node.ssh_target()
    times: dict[str, list[float]] = {"console": [], "streamed": [], "floor": []}
    lines: list[str] = []

    async def say(text: str) -> None:
        lines.append(text)

    async def console(connection) -> None:
        await ensure_image(connection, target.label, reference, say)

    async def stream(connection) -> None:
        await streamed(connection, archive)

    async def floor(connection) -> None:
        await run_checked(connection, target.label, "loading", ["podman", "load", "--quiet", "--input", str(archive)],
                          timeout=1800)

    async with await connect(target) as connection:
        for _ in range(rounds):
            for name, way in (("console", console), ("streamed", stream), ("floor", floor)):
                await remove(connection, reference)
                started = time.monotonic()
                await way(connection)
                times[name].append(time.monotonic() - started)
                assert await has_image(connection, reference), name
                print(f"  {name}: {times[name][-1]:.1f} s", flush=True)
    print("  the console's progress lines:", *lines[-4:], sep="\n    ")
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", choices=["mpi", "horovod", "mindspore"], default="mpi")
    parser.add_argument("--rounds", type=int, default=2)
    args = benchkit.begin("image_transfer", parser, 1800)
    with benchkit.Console(VAR, nodes=1, slots=1):
        from jobs.models import EngineVersion, Node
        from jobs.runtime.node_images import console_archive

        version = next(version for version in EngineVersion.objects.exclude(image="")
                       if f"/{args.image}:" in version.image)
        archive = console_archive(version.image)
        assert archive is not None, f"no archive of {version.image}: run make images"
        node = Node.objects.get()
        size = archive.stat().st_size / 2**20
        print(f"{version.image}: {size:,.0f} MiB, {args.rounds} rounds, taking turns", flush=True)
        times = asyncio.run(measure(node, version.image, archive, args.rounds))
    best = {name: min(values) for name, values in times.items()}
    rows = [[name, f"{best[name]:.1f}", f"{statistics.median(times[name]):.1f}", f"{size / best[name]:,.0f}",
             f"{best[name] / best['floor']:.2f}"] for name in ("console", "streamed", "floor")]
    print(f"\n{version.image} ({size:,.0f} MiB) onto a node that lacks it; {benchkit.load_line()} at the end")
    print(benchkit.table(["way", "best s", "median s", "MiB/s", "x floor"], rows))
    print("console: SFTP copy, then podman load --input; streamed: over one SSH channel into podman load; "
          "floor: podman load --input of the archive in place")


if __name__ == "__main__":
    main()
