"""A job's network policy on its nodes: loaded before each worker's container starts, deleted at teardown,
and deleted by the node's health check once the job that made it is no longer live on the node.

The ruleset is built from plain values in jobs.launch.network_policy; node_scripts/network-policy.sh
loads it with `nft` over the SSH connection the step already holds (the node's root, in the node's own
network namespace), adding the console's address as the node sees this connection come from.
"""

import shlex
from contextvars import ContextVar
from pathlib import Path

import asyncssh
from django.conf import settings

from jobs.launch.network_policy import (
    AllowedDestination,
    node_policy,
    parse_allowed_destinations,
    policy_tables,
    removal,
    ruleset,
    table_name,
)
from jobs.launch.plan import JobPlan, WorkerPlan
from jobs.models import LauncherDefaults
from jobs.runtime.ssh import NodeError, run_checked

# Read here, not through preparation.NODE_SCRIPTS: the preparation imports this module.
POLICY_SCRIPT = (Path(__file__).resolve().parent / "node_scripts" / "network-policy.sh").read_text()
NFT_LIST_TABLES = shlex.join(["nft", "list", "tables", "inet"])
# What a shell says of a command it cannot find.
COMMAND_NOT_FOUND = 127


# The administrator's allowed destinations for the preparation at hand: read from the database by the run
# (allowed_destinations, in the run's own thread) and set before the preparation starts. Unset, a job may
# reach its own workers only.
ALLOWED_DESTINATIONS: ContextVar[tuple[AllowedDestination, ...]] = ContextVar("allowed_destinations", default=())


def allowed_destinations() -> tuple[AllowedDestination, ...]:
    return tuple(parse_allowed_destinations(LauncherDefaults.current().job_allowed_destinations))


def _script(*arguments: str) -> list[str]:
    return ["sh", "-c", POLICY_SCRIPT, "network-policy", *arguments]


async def apply_policy(connection: asyncssh.SSHClientConnection, plan: JobPlan, worker: WorkerPlan,
                       job_uid: int) -> None:
    """Load this worker's policy on its node; without it the container must not start (NodeError). A node reached
    without root holds none: its firewall is the Slurm site's (the pool's page says so)."""
    if worker.rootless:
        return
    policy = node_policy(worker.container_name, job_uid, worker.node.port,
                         [other.address for other in plan.workers], [], ALLOWED_DESTINATIONS.get())
    await run_checked(connection, worker.node.label, "applying the job's network policy",
                      _script("apply", policy.table, ruleset(policy)))


async def remove_tables(connection: asyncssh.SSHClientConnection, label: str, tables: list[str]) -> str:
    """Delete these policy tables (those already gone are fine); "" when done, else why not."""
    if not tables:
        return ""
    try:
        await run_checked(connection, label, "removing the job's network policy", _script("load", removal(tables)))
    except NodeError as error:
        return error.reason
    return ""


async def remove_policy(connection: asyncssh.SSHClientConnection, worker: WorkerPlan) -> str:
    """Delete this worker's policy from its node; "" when done (or never made), else why not."""
    if worker.rootless:
        return ""
    problem = await remove_tables(connection, worker.node.label, [table_name(worker.container_name)])
    return f"removing the network policy failed: {problem}" if problem else ""


async def listed_tables(connection: asyncssh.SSHClientConnection) -> tuple[list[str] | None, str]:
    """(the policy tables on the node, "") or (None, why they cannot be listed: a node without nft cannot
    hold a job's policy)."""
    result = await connection.run(NFT_LIST_TABLES, check=False, timeout=settings.SSH_COMMAND_TIMEOUT)
    if result.exit_status == COMMAND_NOT_FOUND:
        return None, "nft (nftables), which holds each job's network policy, is not installed"
    if result.exit_status != 0:
        return None, f"listing the network policies failed: {str(result.stderr or '').strip()[-500:]}"
    return policy_tables(str(result.stdout or "")), ""
