"""A job's network policy, built from plain values: the administrator's allowed destinations, the nftables
ruleset (read by the kernel's own nft in a throwaway network namespace), the node script that loads it
with the console's address, the leftovers the health check removes, and job ports nobody can predict."""

import ipaddress
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from jobs.launch.network_policy import (
    AllowedDestination,
    PolicyError,
    node_policy,
    parse_allowed_destinations,
    policy_tables,
    removal,
    ruleset,
    table_name,
)
from jobs.models import JobStatus, LauncherDefaults, Node, Worker
from jobs.runtime.network_policy import POLICY_SCRIPT
from jobs.runtime.node_health import Probe, leftover_policies, record
from jobs.submission.jobs import sshd_port_for

CONTAINER = "tc-42-w0-0a1b2c3d"
TABLE = "tc_policy_tc_42_w0_0a1b2c3d"
WORKERS = ["10.9.0.1", "10.9.0.2"]
can_load_rules = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("unshare"),
                                    reason="needs root, nft and unshare (a throwaway network namespace)")


def policy(**changes):
    values = {"container_name": CONTAINER, "job_uid": 1000, "node_ssh_port": 22, "worker_addresses": WORKERS,
              "console_addresses": ["10.9.0.254"], "allowed": parse_allowed_destinations("192.0.2.10 5000\n10.20.0.0/16")}
    return node_policy(**{**values, **changes})


def chain_rules(text: str, name: str) -> list[str]:
    """The rules of one chain of a ruleset, in order."""
    lines = text.splitlines()
    start = lines.index(f"\tchain {name} {{") + 1
    return [line.strip() for line in lines[start:lines.index("\t}", start)]]


def in_fresh_namespace(script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a shell script in a network namespace of its own, gone when the script ends."""
    return subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], **(env or {})})


def test_allowed_destinations_are_networks_with_an_optional_port_or_range():
    text = """
        # object storage, anywhere in its network
        10.20.0.0/16
        192.0.2.10 5000   # a registry
        fd00::53 53
        198.51.100.7/24 9000-9100
    """
    assert parse_allowed_destinations(text) == [
        AllowedDestination(ipaddress.ip_network("10.20.0.0/16")),
        AllowedDestination(ipaddress.ip_network("192.0.2.10/32"), 5000, 5000),
        AllowedDestination(ipaddress.ip_network("fd00::53/128"), 53, 53),
        AllowedDestination(ipaddress.ip_network("198.51.100.0/24"), 9000, 9100),
    ]
    assert parse_allowed_destinations("") == []


@pytest.mark.parametrize("line", ["registry.example 443", "10.0.0.1 0", "10.0.0.1 70000", "10.0.0.1 443 tcp",
                                  "10.0.0.1 90-80", "10.0.0.1 -5", "10.0.0.0/33", "10.0.0.1 4a"])
def test_a_destination_that_cannot_be_read_is_refused_naming_its_line(line):
    with pytest.raises(PolicyError, match=f"'{line}'"):
        parse_allowed_destinations(f"10.0.0.0/8\n{line}\n")


@pytest.mark.django_db
def test_the_launcher_defaults_refuse_a_destination_they_cannot_read():
    defaults = LauncherDefaults.current()
    defaults.job_allowed_destinations = "10.0.0.0/8\nthe registry"
    with pytest.raises(ValidationError) as refused:
        defaults.full_clean()
    assert "job_allowed_destinations" in refused.value.message_dict
    defaults.job_allowed_destinations = "10.0.0.0/8\n192.0.2.10 5000"
    defaults.full_clean()


def test_the_ruleset_lets_in_only_the_console_and_the_jobs_workers_and_lets_the_job_reach_only_those_allowed():
    text = ruleset(policy(worker_addresses=[*WORKERS, "fd00::7"]))
    assert text.startswith(f"table inet {TABLE} {{}}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n")
    assert "set job_workers_v4 { type ipv4_addr; elements = { 10.9.0.1, 10.9.0.2 }; }" in text
    assert "set job_workers_v6 { type ipv6_addr; elements = { fd00::7 }; }" in text
    assert "set console_v4 { type ipv4_addr; elements = { 10.9.0.254 }; }" in text
    assert "set console_v6 { type ipv6_addr; }" in text
    inbound = chain_rules(text, "inbound")
    # The node's SSH port is open before anything is refused: the console is never locked out of a node.
    assert inbound.index("tcp dport 22 accept") < len(inbound) - 1
    assert inbound[-1] == "meta l4proto { tcp, udp, udplite, sctp, dccp } th dport 1024-65535 reject with icmpx admin-prohibited"
    # Only the job's uid is held: the node's own services (root) go where they went before.
    assert chain_rules(text, "outbound")[-1] == "meta skuid 1000 jump job_outbound"
    rules = chain_rules(text, "job_outbound")
    assert rules[-1] == "reject with icmpx admin-prohibited"
    assert "ip daddr 192.0.2.10/32 meta l4proto { tcp, udp } th dport 5000 accept" in rules
    assert "ip daddr 10.20.0.0/16 accept" in rules
    assert not any("10.9.0.254" in rule for rule in rules), "the console is not a destination of the job's"


def test_a_table_is_named_after_its_workers_container_and_other_tables_on_the_node_are_not_ours():
    assert table_name(CONTAINER) == TABLE
    with pytest.raises(PolicyError):
        table_name("tc-42 w0; flush ruleset")
    listing = f"table inet {TABLE}\ntable inet firewalld\ntable ip nat\ntable inet tc_policy_tc_7_w1_ffee0011\n"
    assert policy_tables(listing) == [TABLE, "tc_policy_tc_7_w1_ffee0011"]
    with pytest.raises(PolicyError):
        removal(["tc_policy_x; flush ruleset"])


@can_load_rules
def test_the_kernel_loads_the_ruleset_replaces_it_in_place_and_removes_it_even_twice():
    rules, gone = ruleset(policy(worker_addresses=[*WORKERS, "fd00::7"])), removal([TABLE])
    done = in_fresh_namespace(f"""set -e
        printf '%s' '{rules}' | nft -f -
        printf '%s' '{rules}' | nft -f -
        nft list tables
        printf '%s' '{gone}' | nft -f -
        printf '%s' '{gone}' | nft -f -
        echo removed; nft list tables""")
    assert done.returncode == 0, done.stderr
    loaded, after = done.stdout.split("removed\n")
    assert loaded.split() == ["table", "inet", TABLE] and after.strip() == ""


@can_load_rules
@pytest.mark.parametrize("client, console_set", [("10.9.0.254", "console_v4"), ("fd00::254", "console_v6")])
def test_the_node_script_adds_the_address_the_consoles_ssh_comes_from(client, console_set):
    done = in_fresh_namespace(
        f"""sh -c "$POLICY" network-policy apply {TABLE} "$RULES" && nft list set inet {TABLE} {console_set}""",
        {"POLICY": POLICY_SCRIPT, "RULES": ruleset(policy(console_addresses=[])),
         "SSH_CONNECTION": f"{client} 50000 10.9.0.1 22"})
    assert done.returncode == 0, done.stderr
    assert f"elements = {{ {client} }}" in done.stdout


@can_load_rules
def test_the_node_script_loads_nothing_without_the_consoles_address():
    done = in_fresh_namespace(f"""sh -c "$POLICY" network-policy apply {TABLE} "$RULES"; echo "status=$?"; nft list tables""",
                              {"POLICY": POLICY_SCRIPT, "RULES": ruleset(policy(console_addresses=[]))})
    assert "status=65" in done.stdout and TABLE not in done.stdout, done


def test_the_node_script_is_shellcheck_clean():
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed")
    script = Path(__file__).resolve().parents[2] / "jobs" / "runtime" / "node_scripts" / "network-policy.sh"
    done = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.django_db
def test_the_health_check_removes_only_the_policies_of_jobs_no_longer_live_on_the_node(make_job):
    live, ended = make_job(name="live", node_count=1), make_job(name="ended", node_count=1, status=JobStatus.COMPLETED)
    node = Node.objects.create(name="n1", address="10.9.0.1", spec=live.spec)
    for job, name in ((live, "tc-1-w0-aaaaaaaa"), (ended, "tc-2-w0-bbbbbbbb")):
        Worker.objects.create(job=job, index=0, node=node, node_name="n1", address="10.9.0.1", hostname="w0",
                              container_name=name)
    tables = [table_name("tc-1-w0-aaaaaaaa"), table_name("tc-2-w0-bbbbbbbb"), table_name("tc-3-w0-cccccccc")]
    assert leftover_policies(node.pk, tables) == [table_name("tc-2-w0-bbbbbbbb"), table_name("tc-3-w0-cccccccc")]


@pytest.mark.django_db
def test_a_node_that_cannot_hold_a_policy_is_not_ready_and_says_why(make_job):
    node = Node.objects.create(name="bare", address="10.0.0.9", spec=make_job().spec)
    why = "nft (nftables), which holds each job's network policy, is not installed"
    result = record(node, Probe(node.pk, facts={"cpu_cores": 2, "memory_gb": 4.0, "podman": "podman version 4.3.1",
                                                "containers": []}, policy_problem=why))
    node.refresh_from_db()
    assert not result.ready and (node.state, node.state_message) == (Node.State.NOT_READY, why)


@pytest.mark.django_db
def test_a_jobs_sshd_port_is_drawn_from_the_admins_range_not_told_by_its_id():
    defaults = LauncherDefaults.current()
    defaults.sshd_port_min, defaults.sshd_port_max = 30000, 30999
    ports = [sshd_port_for(42, defaults) for _ in range(200)]
    assert all(30000 <= port <= 30999 for port in ports)
    # 200 draws from 1,000 ports: fewer than 100 distinct ones would mean they are not drawn at random.
    assert len(set(ports)) > 100 and ports.count(30042) < 10
    defaults.sshd_port_min = defaults.sshd_port_max = 31000
    assert sshd_port_for(42, defaults) == 31000
