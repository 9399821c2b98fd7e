"""What a health check makes of a node's answers, and what it flags against the node's spec."""

import os
import subprocess

import pytest

from jobs.models import LauncherDefaults, Network, Node, ResourceSpec
from jobs.node_facts import facts_summary, matching_interfaces, parse_facts, socket_ifnames, spec_contradictions
from jobs.runtime.node_health import FACTS_SCRIPT

IFNAMES = ["ib0", "bond0", "eth0"]

GPU_IB_NODE = """\
@@ cpu
72
@@ memory
MemTotal:       527988736 kB
@@ interfaces
bond0
eth0
ib0
lo
@@ rdma
mlx5_0 1 InfiniBand 4: ACTIVE
mlx5_1 1 InfiniBand 1: DOWN
@@ gpus
Tesla V100-SXM2-32GB, 32510
Tesla V100-SXM2-32GB, 32510
@@ openmpi
mpirun (Open MPI) 4.1.4
@@ python
Python 3.7.13
@@ podman
podman version 4.3.1
@@ images
localhost/training-console/mpi:openmpi_4.1-r0123
<none>:<none>
@@ containers
tc-12-w0-5f3a9c1e|/var/lib/training-console/jobs/resnet-12/worker-0|Up 2 minutes
tc-13-w0-0b1c2d3e|<no value>|Exited (0) 5 minutes ago
"""

V100_IB = ResourceSpec(name="v100", gpu_count=8, gpu_model="NVIDIA-V100", cpu_cores=72, memory_gb=512,
                       network=Network.INFINIBAND)


def test_a_gpu_node_with_infiniband_is_read_fact_by_fact():
    facts = parse_facts(GPU_IB_NODE, IFNAMES)

    assert facts["cpu_cores"] == 72
    assert facts["memory_gb"] == 503.5
    assert facts["interfaces"] == ["bond0", "eth0", "ib0", "lo"]
    assert facts["socket_ifnames"] == {"wanted": IFNAMES, "found": ["bond0", "eth0", "ib0"]}
    assert facts["rdma"][0] == {"device": "mlx5_0", "port": "1", "link_layer": "InfiniBand", "state": "ACTIVE"}
    assert facts["gpus"] == [{"model": "Tesla V100-SXM2-32GB", "memory_mib": 32510}] * 2
    assert (facts["openmpi"], facts["python"]) == ("4.1.4", "3.7.13")
    assert facts["containers"] == [
        {"name": "tc-12-w0-5f3a9c1e", "state": "Up 2 minutes", "workdir": "/var/lib/training-console/jobs/resnet-12/worker-0"},
        {"name": "tc-13-w0-0b1c2d3e", "state": "Exited (0) 5 minutes ago", "workdir": ""}]
    assert (facts["podman"], facts["images"]) == ("4.3.1", ["localhost/training-console/mpi:openmpi_4.1-r0123"])


def test_fewer_gpus_than_the_spec_promises_are_flagged_but_a_matching_model_is_not():
    problems = spec_contradictions(parse_facts(GPU_IB_NODE, IFNAMES), V100_IB)

    assert problems == ["2 GPU(s) found, the spec promises 8"]


def test_a_node_without_infiniband_on_an_infiniband_flavor_is_flagged():
    without_rdma = GPU_IB_NODE.replace("mlx5_0 1 InfiniBand 4: ACTIVE\nmlx5_1 1 InfiniBand 1: DOWN\n", "")
    facts = parse_facts(without_rdma, IFNAMES)

    assert "no InfiniBand device on an InfiniBand flavor" in spec_contradictions(facts, V100_IB)


def test_a_roce_flavor_wants_an_ethernet_rdma_port():
    roce = ResourceSpec(name="roce", cpu_cores=8, memory_gb=16, network=Network.ROCE)
    ib_only = parse_facts(GPU_IB_NODE, IFNAMES)
    roce_port = parse_facts(GPU_IB_NODE.replace("mlx5_0 1 InfiniBand", "mlx5_0 1 Ethernet"), IFNAMES)

    assert "no RoCE device on a RoCE flavor" in spec_contradictions(ib_only, roce)
    assert "no RoCE device on a RoCE flavor" not in spec_contradictions(roce_port, roce)


def test_the_wrong_gpu_model_less_memory_and_fewer_cores_are_each_flagged():
    a100 = ResourceSpec(name="a100", gpu_count=2, gpu_model="NVIDIA-A100", cpu_cores=96, memory_gb=1024,
                        network=Network.INFINIBAND)

    problems = spec_contradictions(parse_facts(GPU_IB_NODE, IFNAMES), a100)

    assert problems == [
        "GPU model Tesla V100-SXM2-32GB is not the spec's NVIDIA-A100",
        "72 CPU cores found, the spec promises 96",
        "503.5 GB of memory found, the spec promises 1024 GB",
    ]


def test_a_node_without_nvidia_smi_is_flagged_on_a_gpu_flavor_while_mpi_and_python_come_with_the_image():
    bare = ("@@ cpu\n72\n@@ memory\nMemTotal: 527988736 kB\n@@ interfaces\nlo\neth0\n"
            "@@ rdma\nmlx5_0 1 InfiniBand 4: ACTIVE\n"
            "@@ gpus\n!absent\n@@ openmpi\n!absent\n@@ python\n!absent\n@@ podman\n!absent\n@@ containers\n")

    facts = parse_facts(bare, IFNAMES)

    assert spec_contradictions(facts, V100_IB) == ["0 GPU(s) found, the spec promises 8"]
    assert facts["podman"] is None, "the health check makes such a node NotReady (no container runtime)"


def test_gpus_without_a_cdi_spec_are_flagged_as_out_of_the_containers_reach():
    facts = parse_facts(GPU_IB_NODE + "@@ cdi\nno\n", IFNAMES)
    assert "no CDI spec for the GPUs (run nvidia-ctk cdi generate): containers cannot get them" in \
        spec_contradictions(facts, V100_IB)


def test_a_failing_nvidia_smi_is_reported_in_its_own_words():
    broken = GPU_IB_NODE.replace("Tesla V100-SXM2-32GB, 32510\nTesla V100-SXM2-32GB, 32510\n",
                                 "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n"
                                 "!error 255\n")
    facts = parse_facts(broken, IFNAMES)

    assert facts["gpus"] == []
    assert spec_contradictions(facts, V100_IB)[0] == (
        "nvidia-smi failed: Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error")


def test_no_interface_of_nccl_socket_ifname_is_flagged_unless_the_flavor_is_single_node():
    facts = parse_facts("@@ interfaces\nlo\nens5\n@@ openmpi\nmpirun (Open MPI) 4.1.4\n@@ python\nPython 3.11.2\n",
                        IFNAMES)
    socket_spec = ResourceSpec(name="cpu", cpu_cores=1, memory_gb=1, network=Network.SOCKET)
    single = ResourceSpec(name="one", cpu_cores=1, memory_gb=1, network=Network.NONE)

    assert spec_contradictions(facts, socket_spec) == [
        "none of the interfaces NCCL_SOCKET_IFNAME names (ib0,bond0,eth0) exists"]
    assert spec_contradictions(facts, single) == []


@pytest.mark.parametrize("wanted, present, found", [
    (["eth"], ["lo", "eth0", "eth1", "ib0"], ["eth0", "eth1"]),
    (["=eth0"], ["eth0", "eth01"], ["eth0"]),
    (["^docker", "lo"], ["lo", "docker0", "ens5"], ["ens5"]),
    (["ib0", "bond0", "eth0"], ["lo"], []),
])
def test_interfaces_match_nccl_socket_ifname_as_nccl_reads_it(wanted, present, found):
    assert matching_interfaces(wanted, present) == found


def test_the_interfaces_looked_for_are_the_ones_jobs_are_launched_with():
    assert socket_ifnames(LauncherDefaults().x_args) == IFNAMES
    assert socket_ifnames("-x NCCL_DEBUG=INFO -x NCCL_SOCKET_IFNAME=^docker,lo") == ["^docker", "lo"]
    assert socket_ifnames("-x NCCL_DEBUG=INFO") == IFNAMES


def test_the_summary_line_names_gpus_cores_memory_interfaces_and_versions():
    summary = facts_summary(parse_facts(GPU_IB_NODE, IFNAMES))

    assert summary == ("2 × Tesla V100-SXM2-32GB (31 GB) · 72 cores · 503.5 GB · bond0,eth0,ib0 · "
                       "mlx5_0/1 InfiniBand, mlx5_1/1 InfiniBand · Podman 4.3.1, 1 image(s)")


def test_the_facts_script_runs_under_sh_and_reads_this_machine(tmp_path):
    # As a check runs it on a node: the script on stdin, the work root as its argument.
    output = subprocess.run(["sh", "-s", "--", str(tmp_path)], input=FACTS_SCRIPT, capture_output=True, text=True,
                            timeout=60, check=True).stdout

    facts = parse_facts(output, IFNAMES)

    assert facts["cpu_cores"] == os.cpu_count()
    assert facts["memory_gb"] > 0
    assert "lo" in facts["interfaces"]
    assert facts["containers"] == []
    assert facts["disk_total_bytes"] > 0 and 0 <= facts["disk_free_bytes"] <= facts["disk_total_bytes"]


def test_a_work_root_not_made_yet_is_measured_on_the_folder_above_it(tmp_path):
    output = subprocess.run(["sh", "-s", "--", str(tmp_path / "not-yet" / "jobs")], input=FACTS_SCRIPT,
                            capture_output=True, text=True, timeout=60, check=True).stdout
    total = parse_facts(output, IFNAMES)["disk_total_bytes"]
    assert total is not None and total == os.statvfs(tmp_path).f_blocks * os.statvfs(tmp_path).f_frsize


@pytest.mark.parametrize("fields, shown", [
    ({}, "Ready"),
    ({"allocated_to_id": 7}, "Busy"),
    ({"draining": True, "allocated_to_id": 7}, "Draining"),
    ({"draining": True}, "Draining"),
    ({"state": Node.State.NOT_READY, "allocated_to_id": 7}, "NotReady"),
    ({"enabled": False}, "NotReady"),
])
def test_a_node_shows_one_state_from_its_health_switches_and_allocation(fields, shown):
    assert Node(**fields).display_state == shown


def test_a_leftovers_folder_comes_from_its_containers_label_and_never_from_outside_the_work_root(db):
    from jobs.runtime.node_health import leftover_workdirs

    facts = {"containers": [
        {"name": "tc-1-w0-a", "state": "Exited", "workdir": "/srv/jobs/gone-1/worker-0"},
        {"name": "tc-2-w0-b", "state": "Exited", "workdir": "/etc"},
        {"name": "tc-3-w0-c", "state": "Exited", "workdir": "/srv/jobs/../../etc"},
        {"name": "tc-4-w0-d", "state": "Exited", "workdir": ""}]}

    found = leftover_workdirs(1, ["tc-1-w0-a", "tc-2-w0-b", "tc-3-w0-c", "tc-4-w0-d"], "/srv/jobs", facts)

    assert found == {"tc-1-w0-a": "/srv/jobs/gone-1/worker-0", "tc-2-w0-b": "", "tc-3-w0-c": "", "tc-4-w0-d": ""}
