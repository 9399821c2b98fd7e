"""How long a node that lacks a job's engine image waits for it: the whole archive over SFTP, against a pull of
the layers it lacks from the console's registry (onto an empty node, and onto one that holds the base all engine
images share), beside the floor, `podman load` of the archive where it lies.

Brings up its own console (database, Redis, a local cluster of 1 node on bridge tcimgbr, 10.92.0.0/24) and its
own read-only image registry (jobs.images.registry, on a free loopback port), and, taking turns, empties the
node's image store and brings the image back:

- archive: jobs.runtime.node_images.ensure_image with no registry: the archive copied to the node over SFTP,
  then `podman load --input` (the console's only way before its registry);
- pull, empty node: ensure_image with the registry;
- pull, base held: the same, the node holding the MPI image (the base whose layers the others share), untimed;
- floor: `podman load --input` of the archive where it lies (the local node shares this machine's files), no
  transfer at all.

    .venv/bin/python bench/image_transfer.py [--image horovod|mindspore|mpi] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time

import benchkit

VAR = benchkit.environment("images", subnet="10.92.0.0/24", bridge="tcimgbr", prefix="tcimg")
WAYS = ("archive", "pull, empty node", "pull, base held", "floor")


async def measure(node, reference: str, base: str, archive, rounds: int) -> tuple[dict[str, list[float]], dict[str, int]]:
    from django.conf import settings

    from jobs.runtime.node_images import ensure_image, has_image
    from jobs.runtime.ssh import connect, run_checked

    target = node.ssh_target()
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    received: dict[str, int] = {}
    registry_port = settings.IMAGE_REGISTRY_PORT
    lines: list[str] = []

    async def say(text: str) -> None:
        lines.append(text)

    async with await connect(target) as connection:
        async def bring(image: str, port: int) -> None:
            settings.IMAGE_REGISTRY_PORT = port
            await ensure_image(connection, target.label, image, say)

        for _ in range(rounds):
            for way in WAYS:
                # The bench's own node: its whole store is emptied, so no layer of an earlier way is left.
                await connection.run("podman rmi --all --force >/dev/null 2>&1", check=False)
                if way == "pull, base held" and base != reference:
                    await bring(base, registry_port)
                lines.clear()
                started = time.monotonic()
                if way == "floor":
                    await run_checked(connection, target.label, "loading",
                                      ["podman", "load", "--quiet", "--input", str(archive)], timeout=1800)
                else:
                    await bring(reference, 0 if way == "archive" else registry_port)
                times[way].append(time.monotonic() - started)
                assert await has_image(connection, reference), way
                found = re.search(r"([\d,]+) MiB received", lines[-1] if lines else "")
                if found:
                    received[way] = int(found.group(1).replace(",", ""))
                print(f"  {way}: {times[way][-1]:.1f} s  ({lines[-1] if lines else 'no transfer'})", flush=True)
    settings.IMAGE_REGISTRY_PORT = registry_port
    return times, received


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", choices=["mpi", "horovod", "mindspore"], default="horovod")
    parser.add_argument("--rounds", type=int, default=2)
    args = benchkit.begin("image_transfer", parser, 3000)
    with benchkit.Console(VAR, nodes=1, slots=1):
        from django.conf import settings

        from console import services
        from jobs.images import registry
        from jobs.images.recipes import MPI, SHIPPED
        from jobs.models import Node
        from jobs.runtime.node_images import console_archive

        reference = SHIPPED[args.image].reference
        archive = console_archive(reference)
        assert archive is not None and registry.pushed_digest(reference), f"{reference} is not built: run make images"
        port = services.free_port()
        server = registry.start(VAR / "image-registry.yml", port,
                                registry.config(registry.storage_dir(), port, read_only=True), VAR / "image-registry.log")
        settings.IMAGE_REGISTRY_PORT = port
        try:
            node = Node.objects.get()
            size = archive.stat().st_size / 2**20
            print(f"{reference}: archive {size:,.0f} MiB, {args.rounds} rounds, taking turns", flush=True)
            times, received = asyncio.run(measure(node, reference, MPI.reference, archive, args.rounds))
        finally:
            services.stop(server)
    best = {way: min(values) for way, values in times.items()}
    rows = [[way, f"{best[way]:.1f}", f"{statistics.median(times[way]):.1f}",
             f"{received[way]:,}" if way in received else (f"{size:,.0f}" if way == "archive" else "0"),
             f"{best[way] / best['floor']:.2f}"] for way in WAYS]
    print(f"\n{reference} onto a node that lacks it; {benchkit.load_line()} at the end")
    print(benchkit.table(["way", "best s", "median s", "MiB sent", "x floor"], rows))
    print("archive: SFTP copy, then podman load --input; pull: the layers the node lacks from the console's registry "
          "(zstd), through a port its SSH server forwards; floor: podman load --input of the archive in place")


if __name__ == "__main__":
    main()
