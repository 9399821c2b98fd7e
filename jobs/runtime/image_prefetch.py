"""Engine images brought to nodes before a job needs them: when a version is added or its image changes, when
a node is added or enabled, and when the console starts. A node's first job of an engine otherwise waits
minutes for the image (a 3 GB MindSpore image: 1-3 minutes to copy and load), silent to its user.

Each node takes its images one after another (a node's disk and `podman load` are the bottleneck, not the
network: bench/image_transfer.py), nodes in parallel. What each node is doing is kept on its row
(`Node.image_transfer`: the image, the words of its last step, when), which its admin page shows; a job
that starts on the node meanwhile copies the image itself and says its own progress on its timeline.
"""

import asyncio
import logging
from dataclasses import dataclass

import asyncssh
from asgiref.sync import sync_to_async
from django.utils import timezone

from jobs.models import EngineVersion, Node
from jobs.runtime.node_images import ensure_image
from jobs.runtime.ssh import NodeError, connect

logger = logging.getLogger(__name__)

# Nodes taking images at once: each copy reads the console's disk and fills a link.
PREFETCH_CONCURRENCY = 4


@dataclass(frozen=True)
class Prefetched:
    node: str
    reference: str
    error: str = ""


def wanted_images(version_ids: list[int] | None = None) -> list[str]:
    """The images of the engine versions users can choose (these versions, or all of them), each once."""
    versions = EngineVersion.objects.exclude(image="")
    if version_ids is not None:
        versions = versions.filter(pk__in=version_ids)
    return sorted(set(versions.values_list("image", flat=True)))


def prefetch_nodes(node_ids: list[int] | None = None) -> list[Node]:
    """The enabled nodes of the console's own pools (a Slurm pool's nodes are Slurm's), or these of them."""
    nodes = Node.objects.filter(enabled=True).exclude(pool__backend="slurm")
    if node_ids is not None:
        nodes = nodes.filter(pk__in=node_ids)
    return list(nodes)


def _note(node_id: int, reference: str, text: str) -> None:
    Node.objects.filter(pk=node_id).update(image_transfer={"image": reference, "text": text,
                                                           "at": timezone.now().isoformat()})


async def _prefetch_node(node: Node, references: list[str], gate: asyncio.Semaphore) -> list[Prefetched]:
    done: list[Prefetched] = []
    async with gate:
        try:
            target = node.ssh_target()
            connection = await connect(target)
        except (ValueError, NodeError, asyncssh.Error, OSError) as error:
            return [Prefetched(node.name, reference, str(error)) for reference in references]
        async with connection:
            for reference in references:
                async def say(text: str, reference: str = reference) -> None:
                    await sync_to_async(_note)(node.pk, reference, text)

                try:
                    await ensure_image(connection, node.name, reference, say)
                except (NodeError, asyncssh.Error, OSError, TimeoutError) as error:
                    await say(f"{node.name}: {reference} could not be brought: {error}")
                    done.append(Prefetched(node.name, reference, str(error)))
                    continue
                done.append(Prefetched(node.name, reference))
        await sync_to_async(_note)(node.pk, "", f"every engine image is on {node.name}"
                                   if not any(item.error for item in done) else "some images could not be brought")
    return done


def prefetch(node_ids: list[int] | None = None, version_ids: list[int] | None = None) -> list[Prefetched]:
    """Bring the wanted images to the wanted nodes; returns what each node got (or why not)."""
    references = wanted_images(version_ids)
    nodes = prefetch_nodes(node_ids)
    if not references or not nodes:
        return []

    async def everywhere() -> list[list[Prefetched] | BaseException]:
        gate = asyncio.Semaphore(PREFETCH_CONCURRENCY)
        # Whatever one node meets (a database too busy for its note, say) stays that node's.
        return await asyncio.gather(*(_prefetch_node(node, references, gate) for node in nodes), return_exceptions=True)

    results: list[Prefetched] = []
    for node, outcome in zip(nodes, asyncio.run(everywhere()), strict=True):
        if isinstance(outcome, BaseException):
            results += [Prefetched(node.name, reference, repr(outcome)) for reference in references]
        else:
            results += outcome
    for item in results:
        if item.error:
            logger.warning("prefetching %s on %s: %s", item.reference, item.node, item.error)
    return results
