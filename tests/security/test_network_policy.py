"""Jobs do not reach each other's ports: while one user's job runs on one node, another user's job on the
other node tries every door of it (its sshd, its mpirun's listeners, a service of its own), the console's
host and the other node's root sshd. Only its own worker and what the administrator allows answer; the
victim's log holds nothing of it and the victim completes. Root on the attacker's node (which no job's
policy holds) is refused by the victim's node too, and the console still reaches both nodes. A policy an
ended job left on a node is removed by the node's health check."""

import ipaddress
import json
import socket
import threading
from pathlib import Path

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from jobs.launch.network_policy import node_policy, ruleset
from jobs.models import JobStatus, LauncherDefaults, Node, TrainingJob
from jobs.runtime.node_health import check_nodes
from tests.conftest import CLUSTER_OPTIONS
from tests.fixtures import api_client, person
from tests.integration.helpers import log_text, on_node, submit_program, wait_for, wait_for_reports

# The console's host as the nodes see it: the local cluster's bridge.
CONSOLE_HOST = str(ipaddress.ip_network(CLUSTER_OPTIONS["subnet"]).network_address + 1)
JOB_TIMEOUT = 240


class Listener:
    """A TCP service on the console's host, recording who connected and what they sent."""

    def __init__(self, host: str):
        self.socket = socket.create_server((host, 0))
        self.port = self.socket.getsockname()[1]
        self.received: list[tuple[str, bytes]] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, peer = self.socket.accept()
            except OSError:
                return
            with connection:
                connection.settimeout(3)
                try:
                    self.received.append((peer[0], connection.recv(200)))
                except OSError:
                    self.received.append((peer[0], b""))

    def close(self) -> None:
        self.socket.close()


def client_of(username: str) -> APIClient:
    return api_client(person(username))


def node_of(job: TrainingJob, cluster):
    address = job.workers.get(index=0).address
    return next(node for node in cluster if node.address == address)


def listening_ports(node, program: str) -> list[int]:
    """The TCP ports a program listens on at the node's address (the job's containers share its network)."""
    ports = set()
    for line in on_node(node, "ss -Htlnp").splitlines():
        fields = line.split()
        host, _, port = fields[3].rpartition(":") if len(fields) > 3 else ("", "", "")
        if f'(("{program}"' in line and host in ("0.0.0.0", "*", "[::]", node.address) and port.isdigit():
            ports.add(int(port))
    return sorted(ports)


def root_connects(from_node, address: str, port: int) -> bool:
    """Whether root on a node (held by no job's policy) opens a TCP connection to address:port."""
    answer = on_node(from_node, f"timeout 5 bash -c 'exec 3<>/dev/tcp/{address}/{port}' 2>/dev/null && echo reached || echo not")
    return answer.strip() == "reached"


def console_connects(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.attack("a job connects to another job's sshd, mpirun and service ports, the console's host and the "
                    "nodes' root sshd, and sends junk; root on its node tries the other job's ports",
                    "it reaches only its own worker and the allowed destination; the other job logs nothing of it "
                    "and completes; the console still reaches both nodes")
def test_a_job_reaches_only_its_own_workers_and_what_the_admin_allows(console):
    console_service, allowed_service = Listener(CONSOLE_HOST), Listener(CONSOLE_HOST)
    defaults = LauncherDefaults.current()
    defaults.job_allowed_destinations = f"{CONSOLE_HOST} {allowed_service.port}"
    defaults.full_clean()
    defaults.save()
    victim = submit_program(client_of("victim"), "attack_victim.py", node_count=1)
    try:
        service_port = wait_for_reports(victim, "VICTIM", timeout=JOB_TIMEOUT)[0]["service_port"]
        victim = wait_for(victim, [JobStatus.RUNNING], timeout=JOB_TIMEOUT)
        victim_node = node_of(victim, console["cluster"])
        address, victim_port = victim_node.address, victim.sshd_port or 0
        mpirun_ports = listening_ports(victim_node, "mpirun")
        assert mpirun_ports, "the victim's mpirun listens for its daemons"
        targets = {"own_sshd": "SELF:SSHD", "allowed": f"{CONSOLE_HOST}:{allowed_service.port}",
                   "own_node_sshd": "SELF:22", "console_service": f"{CONSOLE_HOST}:{console_service.port}",
                   "victim_node_sshd": f"{address}:22", "victim_sshd": f"{address}:{victim_port}",
                   "victim_service": f"{address}:{service_port}",
                   **{f"victim_mpirun_{port}": f"{address}:{port}" for port in mpirun_ports}}

        attacker = submit_program(client_of("attacker"), "attack_scan.py", node_count=1, parameters=[
            {"name": "targets", "value": ",".join(f"{name}@{where}" for name, where in targets.items())}])
        found = wait_for_reports(attacker, "ATTACK", timeout=JOB_TIMEOUT)[0]
        attacker = wait_for(attacker, [JobStatus.COMPLETED], timeout=JOB_TIMEOUT)
        attacker_node = node_of(attacker, console["cluster"])
        assert attacker_node != victim_node
        # Root on the attacker's node is held by no job's policy: the victim's node refuses it by itself.
        root_reached = [port for port in (victim_port, service_port, *mpirun_ports)
                        if root_connects(attacker_node, address, port)]
        # ... and the console is never locked out: the node's own sshd, the job's sshd.
        console_reaches = (on_node(victim_node, "echo still-in").strip(), console_connects(address, victim_port))
    finally:
        released = Path(settings.NODE_WORK_ROOT) / victim.dns_name / "worker-0" / "home" / "attack-over"
        if released.parent.is_dir():
            released.touch()
        console_service.close()
        allowed_service.close()

    reached = sorted(name for name, outcome in found.items() if outcome.startswith("reached"))
    assert reached == ["allowed", "own_sshd"], json.dumps(found, indent=1)
    assert found["own_sshd"].startswith("reached: b'SSH-2.0-"), found["own_sshd"]
    assert root_reached == [], f"root on {attacker_node.name} reached the victim's ports {root_reached}"
    assert console_reaches == ("still-in", True)
    assert console_service.received == []
    assert [peer for peer, _ in allowed_service.received] == [attacker_node.address]
    victim = wait_for(victim, [JobStatus.COMPLETED], timeout=JOB_TIMEOUT)
    victim_log = log_text(victim)
    assert "VICTIM RECEIVED" not in victim_log and "ATTACK-JUNK" not in victim_log, victim_log[-3000:]
    for node in console["cluster"]:
        assert "tc_policy_" not in on_node(node, "nft list tables"), f"{node.name} keeps a job's network policy"


def test_the_health_check_removes_a_policy_its_job_left_and_keeps_the_node_in_service(console):
    """A teardown that could not reach a node leaves the job's policy there; left, it would refuse the next
    job's traffic to its own workers. The node's next check removes it, and the console was never locked out."""
    node = console["cluster"][0]
    left = ruleset(node_policy("tc-999999-w0-deadbeef", 1000, node.ssh_port, [node.address], [CONSOLE_HOST]))
    on_node(node, f"printf '%s' '{left}' | nft -f -")
    assert "tc_policy_tc_999999_w0_deadbeef" in on_node(node, "nft list tables")

    results = check_nodes(Node.objects.all())

    assert [(result.node, result.ready) for result in results] == [(local.name, True) for local in console["cluster"]]
    assert "tc_policy_" not in on_node(node, "nft list tables")
