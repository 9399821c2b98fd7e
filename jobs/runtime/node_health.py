"""Node health: reach each node over SSH, record what it has, and decide whether it may take jobs.

A check pins the node's host key on first contact and refuses a node that later shows another.
It records GPUs, CPU cores, memory, network interfaces, RDMA devices and the Open MPI and Python
versions; what contradicts the node's spec is flagged (see `spec_contradictions`), not hidden.
Every SSH step has a timeout, and the whole check has one more, so a dead node costs seconds.

Parsing and judging are pure (jobs.node_facts); only `probe` talks to a node and only `record` writes.
"""

import asyncio
import logging
import shlex
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

import asyncssh
from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from jobs.launch.network_policy import table_name
from jobs.launch.plan import SshTarget
from jobs.models import FINAL_STATES, LauncherDefaults, Node, Worker
from jobs.node_facts import NodeFacts, parse_facts, socket_ifnames, spec_contradictions
from jobs.runtime.containers import node_root_argv
from jobs.runtime.network_policy import listed_tables, remove_tables
from jobs.runtime.preparation import NODE_SCRIPTS
from jobs.runtime.ssh import NodeError, connect, host_key_line

logger = logging.getLogger(__name__)

# nvidia-smi can hang on a GPU in a bad state; the script bounds it below this.
HEALTH_COMMAND_TIMEOUT = 30
HEALTH_CONCURRENCY = 32

FACTS_SCRIPT = (NODE_SCRIPTS / "health-facts.sh").read_text()
STOP_SCRIPT = (NODE_SCRIPTS / "stop-worker.sh").read_text()


def leftover_containers(facts: NodeFacts, node_id: int) -> list[str]:
    """This node's job containers that no live job of the node owns: a teardown that failed, or a job deleted since.

    A job is torn down before it reaches a final state, so a container of a final job, of a deleted one,
    or of another job than the node's is a leftover. Each node has its own containers.
    """
    seen = {entry["name"]: entry["state"] for entry in facts.get("containers") or []}
    return [f"{name} ({seen[name]})" for name in leftover_names(facts, node_id)]


# A worker whose containers are the job's: one of a job not ended yet, or of a failed job held for debugging on a
# node it still holds (its containers stay until the hold ends, jobs.runtime.debug_hold; a node force released
# from under a hold is cleaned like any other).
OWNED_BY_A_LIVE_JOB = ~Q(job__status__in=FINAL_STATES) | Q(job__held_until__isnull=False,
                                                            node__allocated_to=F("job"))


def leftover_names(facts: NodeFacts, node_id: int) -> list[str]:
    seen = {entry["name"] for entry in facts.get("containers") or []}
    if not seen:
        return []
    live = set(Worker.objects.filter(node_id=node_id, container_name__in=seen).filter(OWNED_BY_A_LIVE_JOB)
               .values_list("container_name", flat=True))
    return sorted(seen - live)


def leftover_workdirs(node_id: int, names: list[str], work_root: str, facts: NodeFacts | None = None) -> dict[str, str]:
    """Where each leftover's files are on the node: from the container's own label (so a job deleted since,
    rows and all, still has its home and secrets removed), else from its worker's row ("" when neither
    says). Only a folder under the work root is ever named: a label is the node's, checked all the same."""
    root = work_root.rstrip("/")
    labelled = {entry["name"]: entry.get("workdir", "") for entry in (facts or {}).get("containers") or []}
    workers = Worker.objects.filter(node_id=node_id, container_name__in=names).select_related("job")
    recorded = {worker.container_name: f"{root}/{worker.job.dns_name}/worker-{worker.index}" for worker in workers}
    found = {}
    for name in names:
        workdir = labelled.get(name) or recorded.get(name, "")
        inside = workdir.startswith(f"{root}/") and ".." not in workdir.split("/") and "\n" not in workdir
        found[name] = workdir if inside else ""
    return found


def leftover_policies(node_id: int, tables: list[str]) -> list[str]:
    """This node's network policies that no live job of the node owns: a teardown that could not remove
    them. Left there, one would refuse the next job's traffic to its own workers."""
    if not tables:
        return []
    live = Worker.objects.filter(node_id=node_id).filter(OWNED_BY_A_LIVE_JOB).exclude(container_name="")
    owned = {table_name(name) for name in live.values_list("container_name", flat=True)}
    return sorted(set(tables) - owned)


# ---- Talking to nodes ----

@dataclass(frozen=True)
class Probe:
    """What one check learnt: the facts, or why the node could not be checked."""

    node_id: int
    facts: NodeFacts | None = None
    error: str = ""
    host_key: str = ""
    # The job network policies on the node; policy_problem says why the node cannot hold one (no nft).
    policy_tables: tuple[str, ...] = ()
    policy_problem: str = ""


async def probe(node_id: int, target: SshTarget, work_root: str, wanted_ifnames: list[str], *,
                rootless: bool = False) -> Probe:
    """One node's facts; a node reached without root (a Slurm pool's: `work_root` is then its user's) holds no
    network policy of the console's, so none is listed there."""
    try:
        connection = await connect(target)
        async with connection:
            seen_key = host_key_line(connection)
            # The script goes on stdin: the command line (and every SSH log line) stays short.
            result = await connection.run(shlex.join(["sh", "-s", "--", work_root]), input=FACTS_SCRIPT,
                                          check=False, timeout=HEALTH_COMMAND_TIMEOUT)
            tables, policy_problem = await listed_tables(connection) if not rootless else ([], "")
    except NodeError as error:
        return Probe(node_id, error=str(error))
    except TimeoutError:
        return Probe(node_id, error=f"{target.label}: health check failed: timed out after {HEALTH_COMMAND_TIMEOUT} s")
    except (OSError, asyncssh.Error) as error:
        return Probe(node_id, error=f"{target.label}: health check failed: {error or type(error).__name__}")
    if result.exit_status != 0:
        detail = str(result.stderr or "").strip()[-500:]
        return Probe(node_id, error=f"{target.label}: health check failed: exit status {result.exit_status}: {detail}")
    return Probe(node_id, facts=parse_facts(str(result.stdout or ""), wanted_ifnames), host_key=seen_key,
                 policy_tables=tuple(tables or ()), policy_problem=policy_problem)


async def probe_all(targets: list[tuple[int, SshTarget]], work_root: str, wanted_ifnames: list[str],
                    rootless_roots: Mapping[int, str] | None = None) -> list[Probe]:
    """Every node's facts; `rootless_roots`: the work root of each node reached without root, by node id."""
    roots = rootless_roots or {}
    gate = asyncio.Semaphore(HEALTH_CONCURRENCY)
    # Each step already has its timeout; this bounds the sum, so one node can never hold the rest.
    deadline = settings.SSH_CONNECT_TIMEOUT * 2 + HEALTH_COMMAND_TIMEOUT + 5

    async def one(node_id: int, target: SshTarget) -> Probe:
        async with gate:
            try:
                return await asyncio.wait_for(probe(node_id, target, roots.get(node_id, work_root), wanted_ifnames,
                                                    rootless=node_id in roots), deadline)
            except TimeoutError:
                return Probe(node_id, error=f"{target.label}: health check failed: timed out after {deadline} s")

    return list(await asyncio.gather(*(one(node_id, target) for node_id, target in targets)))


# ---- Recording ----

@dataclass(frozen=True)
class CheckResult:
    node: str
    ready: bool
    message: str
    warnings: list[str]


def record(node: Node, result: Probe) -> CheckResult:
    """Write what a check found. Only health fields are written: the allocation is never touched."""
    now = timezone.now()
    nodes = Node.objects.filter(pk=node.pk)
    if result.error:
        nodes.update(state=Node.State.NOT_READY, state_message=result.error, last_checked_at=now,
                     last_check_message=result.error)
        return CheckResult(node.name, False, result.error, [])
    if not node.host_key and result.host_key:
        # First contact: pin what was seen, unless another check pinned a key meanwhile.
        nodes.filter(host_key="").update(host_key=result.host_key)
    facts: NodeFacts = result.facts or {}
    leftovers = leftover_containers(facts, node.pk)
    warnings = spec_contradictions(facts, node.spec)
    if not facts.get("podman"):
        state, message = Node.State.NOT_READY, "podman, the container runtime jobs run in, is not installed"
    elif leftovers:
        state, message = Node.State.NOT_READY, "containers of ended jobs are still there: " + "; ".join(leftovers)
    elif result.policy_problem:
        state, message = Node.State.NOT_READY, result.policy_problem
    else:
        state, message = Node.State.READY, ""
    summary = message or ("reachable; " + "; ".join(warnings) if warnings else "reachable, matches its spec")
    nodes.update(health=facts, last_seen=now, last_checked_at=now, last_check_message=summary)
    # Only if nothing else (a teardown marking the node unclean) changed the state while we looked.
    nodes.filter(state=node.state, state_message=node.state_message).update(state=state, state_message=message)
    return CheckResult(node.name, state == Node.State.READY, summary, warnings)


def check_nodes(nodes: Iterable[Node]) -> list[CheckResult]:
    """Check the nodes concurrently and record each result; returns one result per node."""
    nodes = list(Node.objects.filter(pk__in=[node.pk for node in nodes]).select_related("spec", "pool"))
    targets = []
    unreadable = {}
    for node in nodes:
        try:
            targets.append((node.pk, node.ssh_target()))
        except ValueError as error:  # the sealed key cannot be opened (SECRET_KEY changed)
            unreadable[node.pk] = Probe(node.pk, error=f"{node.name}: {error}")
    wanted = socket_ifnames(LauncherDefaults.current().x_args)
    roots = {node.pk: node.work_root for node in nodes if node.rootless}
    probes = {result.node_id: result
              for result in asyncio.run(probe_all(targets, settings.NODE_WORK_ROOT, wanted, roots))}
    # A teardown that could not reach a node (its network was cut, it rebooted) is finished here, once it
    # answers again: what ended jobs left is removed, and the check looks again.
    leftovers = {node_id: leftover_workdirs(node_id, names, roots.get(node_id, settings.NODE_WORK_ROOT), result.facts)
                 for node_id, result in probes.items() if result.facts
                 and (names := leftover_names(result.facts, node_id))}
    if leftovers:
        cleaned = [(node_id, target) for node_id, target in targets if node_id in leftovers]
        asyncio.run(remove_leftovers(cleaned, leftovers, set(roots)))
        probes.update({result.node_id: result
                       for result in asyncio.run(probe_all(cleaned, settings.NODE_WORK_ROOT, wanted, roots))})
    probes.update(_without_leftover_policies(targets, probes))
    probes.update(unreadable)
    return [record(node, probes[node.pk]) for node in nodes]


def _without_leftover_policies(targets: list[tuple[int, SshTarget]], probes: dict[int, Probe]) -> dict[int, Probe]:
    """Remove the network policies ended jobs left (once their containers are gone: a container that
    outlived its job stays fenced); a node whose leftovers cannot be removed says so."""
    leftovers = {node_id: tables for node_id, result in probes.items()
                 if result.facts and not leftover_names(result.facts, node_id)
                 and (tables := leftover_policies(node_id, list(result.policy_tables)))}
    if not leftovers:
        return {}
    problems = asyncio.run(remove_leftover_policies(
        [(node_id, target) for node_id, target in targets if node_id in leftovers], leftovers))
    return {node_id: replace(probes[node_id], policy_problem=f"network policies of ended jobs are still there "
                                                             f"({', '.join(leftovers[node_id])}): {problem}")
            for node_id, problem in problems.items() if problem}


async def remove_leftover_policies(targets: list[tuple[int, SshTarget]], leftovers: dict[int, list[str]]) -> dict[int, str]:
    """Delete each node's leftover policy tables; {node id: why not} ("" where done)."""
    async def one(node_id: int, target: SshTarget) -> tuple[int, str]:
        logger.info("%s: removing the network policies %s, left by ended jobs", target.label, leftovers[node_id])
        try:
            connection = await connect(target)
            async with connection:
                problem = await remove_tables(connection, target.label, leftovers[node_id])
        except (NodeError, TimeoutError, OSError, asyncssh.Error) as error:
            problem = str(error) or type(error).__name__
        return node_id, problem

    return dict(await asyncio.gather(*(one(node_id, target) for node_id, target in targets)))


async def remove_leftovers(targets: list[tuple[int, SshTarget]], leftovers: dict[int, dict[str, str]],
                           rootless: Collection[int] = ()) -> None:
    async def one(node_id: int, target: SshTarget) -> None:
        try:
            connection = await connect(target)
            async with connection:
                for name, workdir in leftovers[node_id].items():
                    command = (shlex.join(node_root_argv(node_id in rootless, ["sh", "-s", "--", workdir, name])) if workdir
                               else shlex.join(["podman", "rm", "--force", "--time", "2", name]))
                    logger.info("%s: removing %s, left by an ended job", target.label, name)
                    await connection.run(command, input=STOP_SCRIPT if workdir else None, check=False,
                                         timeout=settings.SSH_COMMAND_TIMEOUT)
        except (NodeError, TimeoutError, OSError, asyncssh.Error) as error:
            logger.warning("%s: could not remove what ended jobs left: %s", target.label, error)

    await asyncio.gather(*(one(node_id, target) for node_id, target in targets))


def nodes_due_for_check():
    """The nodes the periodic check looks at: every enabled one, busy or not."""
    return Node.objects.filter(enabled=True)
