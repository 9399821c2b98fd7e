"""The NCCL log parser, diagnosis and `ncclsummary` command against real logs.

Every log in tests/data/nccl-logs has its own `test_log_NN_*` test asserting
what that log really shows (see tests/data/nccl-logs/SOURCES.md); the last
test checks that none was forgotten.
"""

import functools
import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from nccl.diagnosis import Finding, diagnose
from nccl.parser import format_summary_text, parse_nccl_file, parse_nccl_log, parse_nccl_text

LOG_DIR = Path(__file__).resolve().parents[1] / "data" / "nccl-logs"
ALL_LOGS = sorted(LOG_DIR.glob("*.log"))


def log_path(prefix: str) -> Path:
    (path,) = [p for p in ALL_LOGS if p.name.startswith(prefix + "-")]
    return path


@functools.cache
def parsed(prefix: str) -> dict:
    return parse_nccl_file(log_path(prefix)).to_dict()


def rank(data: dict, number: int) -> dict:
    (entry,) = [r for r in data["ranks"] if r["rank"] == number]
    return entry


def codes(findings: list[Finding]) -> dict[str, str]:
    return {finding.code: finding.severity for finding in findings}


def diagnosis(prefix: str, promise: str, nodes: int, expected_ranks=None) -> dict[str, str]:
    return codes(diagnose(parsed(prefix), promised_network=promise, node_count=nodes, expected_ranks=expected_ranks))


# -- invariants over every log ----------------------------------------------------------


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: p.name[:2])
def test_every_log_is_read_completely_and_serialises(path):
    summary = parse_nccl_file(path)
    data = summary.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["unparsed"] == {"count": 0, "examples": [], "parser_errors": 0}
    assert data["line_count"] == len(path.read_text(encoding="utf-8").splitlines())
    assert parse_nccl_text(path.read_text(encoding="utf-8")).to_dict() == data
    assert "NCCL version:" in format_summary_text(summary)


# -- one test per log ---------------------------------------------------------------------------


def test_log_01_nccl_2_3_old_format_ib():
    data = parsed("01")
    assert (data["version"], data["cuda_version"], data["nranks"]) == ("2.3.7", "9.0", 8)
    assert rank(data, 0) | {"bootstrap_address": None} == {
        "rank": 0,
        "host": "learnfair0536",
        "pid": 46393,
        "cuda_dev": 0,
        "nvml_dev": None,
        "bus_id": None,
        "bootstrap_address": None,
    }
    assert [(i["name"], i["address"]) for i in data["bootstrap_interfaces"]] == [("enp1s0f0", "100.97.70.134")]
    assert (data["net"], data["net_source"], data["ib_link_layer"]) == ("IB", "announced", "IB")
    assert [d["name"] for d in data["ib_devices"]] == ["mlx5_1", "mlx5_3", "mlx5_0", "mlx5_2"]
    assert [i["name"] for i in data["ib_oob_interfaces"]] == ["enp1s0f0"]
    assert data["init_complete"] is False and data["warnings"] == [] and data["errors"] == []
    assert data["hosts"] == ["learnfair0536"]


def test_log_02_ibv_create_qp_failed_on_mlx4():
    data = parsed("02")
    assert data["version"] is None and data["nranks"] == 2
    assert (rank(data, 0)["host"], rank(data, 0)["pid"]) == ("ta1-0", 2668)
    assert (rank(data, 1)["host"], rank(data, 1)["pid"], rank(data, 1)["cuda_dev"]) == ("ta1-1", 2712, 0)
    assert data["net"] == "IB" and data["transport_counts"] == {"NET/IB": 1}
    assert data["ib_devices"][0] | {"hosts": []} == {"name": "mlx4_0", "port": 2, "link_layer": None, "hosts": []}
    assert data["gdrdma"] is False  # "GPU Direct RDMA Disabled ... (not supported b" / "y GPU)" wrapped line
    assert data["warnings"] == ["ta1-1 pid 2712 dev 0 (rank 1): Call to ibv_create_qp failed [misc/ibvwrap.cu:280]"]
    assert data["error_codes"] == {"ncclSystemError": 1}
    assert any("ibv_create_qp" in e and "ncclSystemError" in e for e in data["errors"])
    assert data["communicators"]["handles"] == 2 and data["init_complete"] is False


def test_log_04_direct_shared_memory_and_cuda_invalid_argument():
    data = parsed("04")
    assert data["transport_counts"] == {"NET/IB": 3, "SHM": 9}
    assert data["transport_variants"]["direct shared memory"] == 9
    expected = {
        0: ("heinzel135", 151778, 0),
        1: ("heinzel135", 151779, 1),
        2: ("heinzel135", 151780, 2),
        3: ("heinzel135", 151781, 3),
        4: ("heinzel136", 84299, 0),
        5: ("heinzel136", 84300, 1),
        6: ("heinzel136", 84301, 2),
    }
    assert {r["rank"]: (r["host"], r["pid"], r["cuda_dev"]) for r in data["ranks"]} == expected
    (warning,) = data["warning_details"]
    assert (warning["host"], warning["cuda_dev"], warning["rank"], warning["kind"]) == (
        "heinzel135",
        2,
        2,
        "shm-cuda-failure",
    )
    assert warning["message"] == "Cuda failure 'invalid argument'" and warning["source"] == "include/shm.h:42"
    assert data["error_codes"] == {"ncclUnhandledCudaError": 1}


def test_log_05_nccl_2_4_bootstrap_printed_as_net_socket():
    data = parsed("05")
    assert data["version"] == "2.4.7" and data["cuda_version"] == "10.0"
    boot = {(i["name"], i["address"]): i["hosts"] for i in data["bootstrap_interfaces"]}
    assert boot == {("ib0", "192.168.11.1"): ["master_node"], ("ib0", "192.168.11.2"): ["secondary_node"]}
    assert (data["net"], data["net_source"], data["ib_link_layer"]) == ("IB", "inferred", "IB")
    assert [(d["name"], d["port"]) for d in data["ib_devices"]] == [("mlx5_0", 1)]
    assert data["env"] == {"NCCL_IB_DISABLE": "0"} and data["net_plugin"]["state"] == "internal"
    assert data["hosts"] == ["master_node", "secondary_node"] and data["process_count"] == 8
    assert data["init_complete"] is None


def test_log_07_64_ranks_over_sockets_with_rings_and_trees():
    data = parsed("07")
    assert data["nranks"] == 64 and len(data["hosts"]) == 16
    assert data["transports"] == ["NET/Socket"] and data["transport_counts"] == {"NET/Socket": 11}
    assert (data["net"], data["net_source"]) == ("Socket", "connections")
    assert data["init_complete"] is True and data["communicators"]["init_complete"] == 1
    assert (rank(data, 17)["host"], rank(data, 17)["pid"]) == ("ip-172-31-6-136", 45332)
    assert rank(data, 34)["host"] == "ip-172-31-11-92"  # "34 -> 33 [send]" is printed by the sender
    assert rank(data, 24)["host"] == "ip-172-31-10-87"  # "16 -> 24 [receive]" by the receiver
    assert rank(data, 25)["host"] == "ip-172-31-14-180"  # "Trees [0] 26->25->-1/-1/-1"
    assert data["trees"]["lines"] == 4


def test_log_08_efa_libfabric_net_name_with_a_space():
    data = parsed("08")
    assert data["transport_counts"] == {"NET/Libfabric": 3, "P2P/IPC": 6}
    assert data["transport_variants"]["NET/AWS Libfabric"] == 3
    assert data["net"] == "Libfabric" and data["net_plugin"]["state"] == "loaded"
    assert {r["rank"] for r in data["ranks"] if r["host"] == "ip-172-32-36-209"} == {25, 26, 27, 28, 29, 30}
    assert rank(data, 26)["cuda_dev"] == 2
    (warning,) = data["warning_details"]
    assert warning["rank"] == 23 and warning["launcher_rank"] == 23 and warning["kind"] == "libfabric"
    assert "Couldn't open AV" in warning["message"]
    assert data["error_codes"] == {"ncclSystemError": 1}


def test_log_10_mpirun_prefix_and_loopback_sockets():
    data = parsed("10")
    assert data["version"] == "2.5.6" and data["hosts"] == ["5873af64cf59"] and data["process_count"] == 4
    assert [(i["name"], i["address"]) for i in data["bootstrap_interfaces"]] == [("lo", "127.0.0.1")]
    assert [(i["name"], i["index"]) for i in data["socket_interfaces"]] == [("lo", 0)]
    assert data["ib_no_device"] is True and (data["net"], data["net_source"]) == ("Socket", "inferred")
    assert data["net_plugin"]["state"] == "internal"


def test_log_11_ipv6_link_local_interfaces_with_ib_disabled():
    data = parsed("11")
    assert [(i["index"], i["name"], i["address"]) for i in data["socket_interfaces"]] == [
        (0, "ip6tnl0", "fe80::e866:19ff:fe1e:a688%ip6tnl0"),
        (1, "veth0", "2a02:6b8:fc1d:3606:0:4457:edef:600a"),
    ]
    assert data["bootstrap_interfaces"] == data["socket_interfaces"]
    assert data["env"]["NCCL_IB_DISABLE"] == "1" and data["net"] == "Socket"
    assert data["hosts"] == ["NvYt-dcf441d17e21-1bdf2bc9-79ce82ee-3fe03e8-c2959af0"]


def test_log_13_roce_with_24_forced_channels():
    data = parsed("13")
    assert data["version"] == "2.6.4" and data["nranks"] == 2
    assert (data["net"], data["ib_link_layer"]) == ("IB", "RoCE")
    assert data["ib_oob_interfaces"][0]["name"] == "enp177s0f0"
    assert data["env"] == {"NCCL_MAX_NCHANNELS": "24", "NCCL_MIN_NCHANNELS": "24", "NCCL_NTHREADS": "512"}
    assert data["rings"]["channel_count"] == 24
    assert data["rings"]["orders"] == [{"ranks": [0, 1], "channels": [0, 1, 2, 3]}]


def test_log_14_bootstrap_connection_refused():
    data = parsed("14")
    assert data["connect_retries"] == {"Connection refused": 3}
    (warning,) = data["warning_details"]
    assert warning["kind"] == "connection-refused" and warning["source"] == "include/socket.h:390"
    assert data["error_codes"] == {"ncclSystemError": 1} and data["net"] is None
    assert data["hosts"] == ["tj1-asr-train-v100-13"] and data["nccl_line_count"] == 7


def test_log_16_roce_ibv_create_cq_failed_and_bus_ids():
    data = parsed("16")
    assert data["version"] == "2.7.8" and data["nranks"] == 2
    assert (data["net"], data["ib_link_layer"]) == ("IB", "RoCE")
    assert (rank(data, 0)["host"], rank(data, 0)["bus_id"]) == ("spark01", "3000")
    assert rank(data, 1)["bus_id"] == "3000" and rank(data, 1)["host"] is None
    assert data["rings"]["channel_count"] == 2 and data["trees"] == {"lines": 1, "channels": 2, "graph_lines": 0}
    assert data["warnings"] == ["spark01 pid 2683 dev 0 (rank 0): Call to ibv_create_cq failed [misc/ibvwrap.cc:268]"]
    assert data["errors"] == ["Call to ibv_create_cq failed [misc/ibvwrap.cc:268]"]


def test_log_17_socket_channels_on_the_docker_veth():
    data = parsed("17")
    assert data["net_device_indices"] == {"NET/Socket": [1]}
    assert data["socket_interfaces"][1]["name"] == "veth25f2e72"
    assert data["connect_retries"] == {"Connection timed out": 2}
    assert (rank(data, 1)["host"], rank(data, 1)["bus_id"]) == ("worker", "18000")
    assert data["warnings"] == [] and data["unparsed"]["count"] == 0  # the glog first line is not NCCL


def test_log_19_unexpanded_cuda_suffix_and_ibext():
    data = parsed("19")
    assert data["version"] == "2.8.3" and data["cuda_version"] is None
    assert data["net"] == "IB" and data["net_plugin"]["name"] == "IBext"
    assert [w["cuda_dev"] for w in data["warning_details"]] == [4, 5, 6]
    assert {w["kind"] for w in data["warning_details"]} == {"ibv-call-failed"}
    assert data["error_codes"] == {"ncclSystemError": 2}  # dev 4 and dev 5 print a backtrace


def test_log_20_wsl2_topology_realpath_failure():
    data = parsed("20")
    assert data["version"] == "2.9.9" and data["net"] == "Socket" and data["net_source"] == "announced"
    assert data["bootstrap_interfaces"][0]["name"] == "lo"
    (warning,) = data["warning_details"]
    assert warning["kind"] == "topology-realpath" and warning["launcher_rank"] == 0
    assert "graph/xml.cc:469" in data["errors"][1]


def test_log_22_two_kubernetes_pods_over_sockets():
    data = parsed("22")
    assert data["version"] == "2.11.4" and len(data["hosts"]) == 2
    assert {i["address"] for i in data["bootstrap_interfaces"]} == {"10.84.52.31", "10.84.179.52"}
    assert data["net"] == "Socket" and data["ib_no_device"] is True and data["errors"] == []


def test_log_23_sockets_even_inside_a_node():
    data = parsed("23")
    assert data["transport_counts"] == {"NET/Socket": 8} and data["version"] is None
    buses = {r["rank"]: (r["host"], r["bus_id"]) for r in data["ranks"]}
    assert buses[1] == ("ip-172-31-0-63", "1c0") and buses[2] == ("ip-172-31-0-63", "1d0")
    assert buses[4] == ("ip-172-31-12-129", "1b0") and buses[6] == ("ip-172-31-12-129", "1d0")
    assert data["intra_host_net_connections"] == 3


def test_log_25_four_ib_hcas_in_docker():
    data = parsed("25")
    assert data["version"] == "2.13.4" and data["cuda_driver_version"] == "11.7"
    assert [d["name"] for d in data["ib_devices"]] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert data["ib_link_layer"] == "IB" and data["net"] == "IB"
    assert {i["address"] for i in data["bootstrap_interfaces"]} == {"10.0.1.9", "10.0.1.7"}


def test_log_26_nccl_tests_header_and_shared_hostname():
    data = parsed("26")
    assert data["version"] == "2.18.1" and data["hosts"] == ["user"]
    assert rank(data, 15) | {"bootstrap_address": None} == {
        "rank": 15,
        "host": "user",
        "pid": 169132,
        "cuda_dev": 7,
        "nvml_dev": None,
        "bus_id": "ca000",
        "bootstrap_address": None,
    }
    assert [i["address"] for i in data["bootstrap_interfaces"]] == ["192.168.1.14"]
    assert data["net_plugin"]["state"] == "internal" and data["net"] is None


def test_log_28_version_as_info_line_single_rank_roce():
    data = parsed("28")
    assert data["version"] == "2.18.3" and data["nranks"] == 1
    assert rank(data, 0) | {"bootstrap_address": None} == {
        "rank": 0,
        "host": "host-2",
        "pid": 38610,
        "cuda_dev": 0,
        "nvml_dev": 0,
        "bus_id": "65000",
        "bootstrap_address": None,
    }
    assert rank(data, 0)["bootstrap_address"] == "198.18.2.2"
    assert data["comm_ids"] == ["0xbd10cc2bcb56e132"] and data["init_complete"] is False
    assert data["env"] == {"NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_IFNAME": "enp179s0f0"}
    assert (data["net"], data["ib_link_layer"]) == ("IB", "RoCE")


def test_log_29_single_node_no_ib_device():
    data = parsed("29")
    assert data["version"] == "2.18.5" and data["cuda_version"] == "11.8"
    assert data["ib_no_device"] is True and (data["net"], data["net_source"]) == ("Socket", "inferred")
    assert data["process_count"] == 2 and data["unparsed"]["count"] == 0  # DeepSpeed line ignored


def test_log_31_abort_complete_with_traceback():
    data = parsed("31")
    assert data["version"] == "2.18.3" and data["nranks"] == 16
    assert data["communicators"]["aborted"] == 2 and data["init_complete"] is None
    assert (rank(data, 13)["cuda_dev"], rank(data, 13)["bus_id"]) == (5, "90000")
    assert (rank(data, 15)["cuda_dev"], rank(data, 15)["bus_id"]) == (7, "bd000")
    assert "Last error: Socket recv failed while polling for opId=0x7ffea68e01c0" in data["errors"]
    assert any("ProcessGroupNCCL.cpp:1182" in e for e in data["errors"])
    assert data["hosts"] == ["<cluster_name>"]


def test_log_32_bootstrap_on_ipv6_link_local_ipoib():
    data = parsed("32")
    (iface,) = data["bootstrap_interfaces"]
    assert (iface["name"], iface["address"]) == ("ib1", "fe80::966d:ae03:b2:62c4%ib1")
    assert data["process_count"] == 8 and data["cuda_driver_version"] == "12.2"


def test_log_34_roce_two_hosts_two_plugin_message_formats():
    data = parsed("34")
    assert data["version"] == "2.19.3" and data["ib_link_layer"] == "RoCE"
    assert [d["name"] for d in data["ib_devices"]] == ["mlx5_10", "mlx5_11"]
    assert data["net_plugin"]["state"] == "internal"
    assert (rank(data, 1)["host"], rank(data, 1)["pid"], rank(data, 1)["bus_id"]) == ("dgxh100-3", 2152176, "d1000")


def test_log_35_graph_ring_lines_are_not_connections():
    data = parsed("35")
    assert data["transport_counts"] == {} and data["nranks"] == 2
    assert data["rings"]["graph_lines"] == 4 and data["trees"]["graph_lines"] == 8
    assert data["rings"]["channel_count"] == 4 and data["trees"]["lines"] == 1
    assert (rank(data, 0)["host"], rank(data, 1)["host"]) == ("dgxh100-4", "dgxh100-3")


def test_log_37_shell_prompt_and_sixteen_bootstrap_interfaces():
    data = parsed("37")
    assert len(data["bootstrap_interfaces"]) == 16
    assert [i["name"] for i in data["bootstrap_interfaces"][:2]] == ["enp7s0", "virbr0"]
    assert data["bootstrap_interfaces"][15]["address"] == "fe80::786d:4fff:fef5:6daf%vethcbdf2e2"
    assert (data["net"], data["ib_link_layer"]) == ("IB", "RoCE")
    assert data["nccl_line_count"] == 4


def test_log_38_duplicate_gpu_detected():
    data = parsed("38")
    assert [d["ranks"] for d in data["duplicate_gpus"]] == [[2, 0], [4, 0], [0, 1], [5, 0]]
    assert {d["bus_id"] for d in data["duplicate_gpus"]} == {"1000"}
    assert [w["launcher_rank"] for w in data["warning_details"]] == [2, 4, 0, 5]
    assert data["error_codes"] == {"ncclInvalidUsage": 4}


def test_log_40_sharp_collnet_warning_is_not_an_error():
    data = parsed("40")
    assert data["collnet"] == {"plugin": "SHARP", "devices": ["mlx5_5:1"]}
    assert [w["kind"] for w in data["warning_details"]] == ["sharp", "sharp"]
    assert data["errors"] == [] and data["hosts"] == ["C25L18", "C25L19"]
    assert data["nccl_line_count"] == 4  # the SHARP library's own "[C25L18:0:24972 ...]" lines are not NCCL


def test_log_41_ray_prefix_and_topology_dump():
    data = parsed("41")
    assert data["versions"] == ["2.21.5"] and data["cuda_version"] == "12.4"
    assert data["topology"] | {"nics": []} == {
        "dumps": 1,
        "gpus": ["19000", "2d000"],
        "nics": [],
        "nvlink": True,
        "nvswitch": True,
    }
    assert data["hosts"] == ["gh-3714u06"]


def test_log_43_efa_libfabric_plugin():
    data = parsed("43")
    assert data["net"] == "Libfabric" and "efa" in data["net_detail"]
    assert data["hosts"] == ["8h200-2", "8h200-3"]


def test_log_44_gdrdma_and_p2p_cumem():
    data = parsed("44")
    assert data["transports"] == ["NET/IB", "P2P/CUMEM"]
    assert data["transport_counts"] == {"NET/IB": 9, "P2P/CUMEM": 5}
    assert data["transport_variants"] == {"NET/IB/GDRDMA": 9, "P2P/CUMEM": 5}
    assert data["gdrdma"] is True and data["net_device_indices"] == {"NET/IB": [2, 3]}
    assert {r["rank"]: (r["host"], r["pid"]) for r in data["ranks"]} == {
        1: ("H20-GPU-05", 1789225),
        2: ("H20-GPU-06", 4015539),
        3: ("H20-GPU-06", 4015540),
    }


def test_log_46_init_complete_in_one_process_for_eight_gpus():
    data = parsed("46")
    assert data["nranks"] == 16 and data["init_complete"] is True
    assert data["communicators"] == {"handles": 5, "init_started": 5, "init_complete": 5, "aborted": 0}
    assert {r["rank"]: r["bus_id"] for r in data["ranks"] if r["bus_id"]} == {
        0: "7000",
        1: "b000",
        4: "88000",
        5: "8b000",
        6: "c8000",
    }
    assert data["comm_ids"] == ["0x49bbd7790311d5eb"] and data["process_count"] == 1


def test_log_47_p2p_direct_pointer_and_net_ib_without_gdr():
    data = parsed("47")
    assert data["transport_counts"] == {"NET/IB": 4, "P2P/direct pointer": 10}
    assert data["transport_variants"]["P2P/direct pointer/read"] == 10
    assert data["gdrdma"] is False and data["net_device_indices"] == {"NET/IB": [3]}
    assert sorted(r["rank"] for r in data["ranks"]) == [4, 5, 6, 7]


def test_log_49_quoted_first_line_and_comm_split():
    data = parsed("49")
    assert data["nranks"] == 4 and data["net"] == "Socket" and data["process_count"] == 4
    assert (rank(data, 0)["cuda_dev"], rank(data, 0)["nvml_dev"], rank(data, 0)["bus_id"]) == (0, 4, "9a000")
    assert data["communicators"]["handles"] == 4 and data["init_complete"] is False
    assert "tj5-sc-ai-h800r-dev01" in data["hosts"] and len(data["hosts"]) == 1


def test_log_50_nvls():
    data = parsed("50")
    assert data["nvls"] is True and data["transports"] == ["NVLS"]
    assert data["channel_counts"] == {"coll": 16, "collnet": 0, "nvls": 16, "p2p": 16}


def test_log_52_p2p_cumem_with_gid_index_env():
    data = parsed("52")
    assert data["transport_counts"] == {"P2P/CUMEM": 14} and data["env"] == {"NCCL_IB_GID_INDEX": "3"}
    assert (rank(data, 37)["cuda_dev"], rank(data, 34)["pid"]) == (5, 982)


def test_log_53_nccl_2_26_init_all_socket_and_empty_ib_list():
    data = parsed("53")
    assert data["version"] == "2.26.2" and data["nranks"] == 2
    assert [(r["rank"], r["cuda_dev"], r["bus_id"]) for r in data["ranks"]] == [(0, 0, "c3000"), (1, 1, "ca000")]
    assert data["ib_devices"] == [] and data["ib_no_device"] is True
    assert data["net"] == "Socket" and data["bootstrap_interfaces"][0]["name"] == "eno1"
    assert data["comm_ids"] == ["0x5ff11f9dc5c16162"] and data["init_complete"] is False


def test_log_55_nested_quote_and_ray_prefix():
    data = parsed("55")
    assert data["hosts"] == ["degamts15"] and data["nranks"] == 8
    assert data["rings"]["orders"] == [{"ranks": list(range(8)), "channels": list(range(7, 20))}]


def test_log_56_python_logging_prefix_and_graph_rings():
    data = parsed("56")
    assert data["hosts"] == ["g340-cd51-4900-b72a-d104-a9bf-df48"] and data["nranks"] == 8
    assert data["rings"]["graph_lines"] == 10 and rank(data, 0)["pid"] == 4181


def test_log_58_fastsocket_warnings_are_not_failures():
    data = parsed("58")
    assert len(data["warnings"]) == 4 and data["errors"] == []
    assert {w["kind"] for w in data["warning_details"]} == {"fastsocket"}
    assert data["net"] == "FastSocket" and data["net_plugin"]["name"] == "FastSocket"


def test_log_59_ten_roce_hcas_behind_mpirun_prefix():
    data = parsed("59")
    assert len(data["ib_devices"]) == 10 and data["ib_link_layer"] == "RoCE"
    assert [i["name"] for i in data["ib_oob_interfaces"]] == ["bond0"]
    assert rank(data, 0) | {"bootstrap_address": None} == {
        "rank": 0,
        "host": "aiplatform-wlf2-ge78-72",
        "pid": 58070,
        "cuda_dev": 0,
        "nvml_dev": 0,
        "bus_id": "19000",
        "bootstrap_address": None,
    }
    assert data["comm_ids"] == ["0xd37e70d13f797e7e"] and data["nranks"] == 4


def test_log_61_traceback_only_no_socket_interface():
    data = parsed("61")
    assert data["version"] == "2.14.3" and data["nccl_line_count"] == 0 and data["hosts"] == []
    assert data["no_socket_interface"] is True
    assert "Last error: Bootstrap : no socket interface found" in data["errors"]
    assert "ncclInternalError: Internal check failed." in data["errors"]


def test_log_62_nccl_2_3_socket_over_ipoib():
    data = parsed("62")
    assert data["version"] == "2.3.7" and data["nranks"] == 8
    assert (data["net"], data["net_source"]) == ("Socket", "announced")
    assert data["socket_interfaces"][0]["name"] == "ib0" and "IP over InfiniBand" in data["net_detail"]
    assert [(r["rank"], r["pid"]) for r in data["ranks"]] == [(0, 46654), (1, 46655), (2, 46656)]
    assert data["communicators"]["handles"] == 3  # "rank 1 nranks 8" and "comm 0x.. rank 1" are one handle


def test_log_64_topology_dump_old_format():
    data = parsed("64")
    assert data["topology"] == {
        "dumps": 1,
        "gpus": ["1c000", "1d000"],
        "nics": ["60000"],
        "nvlink": False,
        "nvswitch": False,
    }
    assert data["net"] == "Socket" and data["process_count"] == 2


def test_log_65_hpcx_plugin_without_ib_falls_back_to_socket():
    data = parsed("65")
    assert data["net_plugin"] == {
        "state": "loaded",
        "name": "IBext",
        "path": "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
    }
    assert data["ib_no_device"] is True and (data["net"], data["net_source"]) == ("Socket", "announced")
    assert data["hosts"] == ["10-12-3-162"]


def test_log_67_ib_with_ipoib_bootstrap():
    data = parsed("67")
    assert data["version"] == "2.10.3" and data["net"] == "IB" and data["ib_link_layer"] == "IB"
    assert data["bootstrap_interfaces"][0]["name"] == "ib0" and data["process_count"] == 5


def test_log_68_version_printed_twice_counts_once():
    data = parsed("68")
    assert data["versions"] == ["2.19.3"]
    assert data["env"] == {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "mlx5_0", "NCCL_IB_MERGE_VFS": "0"}
    assert (rank(data, 1)["host"], rank(data, 1)["bus_id"]) == ("testgpu1", "3000")
    assert data["net"] == "IB" and data["ib_link_layer"] == "IB"


def test_every_log_file_has_its_own_test():
    tested = {name.split("_")[2] for name in globals() if name.startswith("test_log_")}
    assert {path.name[:2] for path in ALL_LOGS} == tested


# -- formats not present in the saved logs ---------------------------------------------


def test_synthetic_formats_of_newer_and_older_versions():
    text = "\n".join(
        [
            "h1:10:11 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0(5)/GDRDMA",
            "h1:10:11 [0] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/IPC/read",
            "h1:10:11 [0] NCCL INFO Channel 00 : 2[2] -> 3[3] via SHM/direct/direct",
            "h1:10:11 [0] NCCL INFO Channel 02/0 : 9[1] -> 0[0] [receive] via NET/IBext_v8/1/GDRDMA",
            "h1:10:11 [0] NCCL INFO NET/IB : Using [0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE} [1]mlx5_4:1/IB/SHARP "
            "; OOB bond0.526:10.1.1.1<0>",
            "h1:10:11 [0] NCCL INFO comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0",
            "h1:10:11 [0] NCCL INFO comm 0x1 rank 0 nranks 16 - COMPLETE",
            "h1:10:11 [0] NCCL INFO Connected all rings",
            "h1:10:11 [0] NCCL INFO 4 coll channels, 2 collnet channels, 0 nvls channels, 4 p2p channels, "
            "1 p2p channels per peer",
        ]
    )
    data = parse_nccl_text(text).to_dict()
    assert data["transports"] == ["CollNet", "NET/IB", "P2P/IPC", "SHM"]
    assert data["transport_variants"]["NET/IB/GDRDMA"] == 1 and data["transport_variants"]["NET/IBext_v8/GDRDMA"] == 1
    assert data["net_device_indices"] == {"NET/IB": [0, 1]}
    assert {(d["name"], d["link_layer"]) for d in data["ib_devices"]} == {
        ("mlx5_2", "RoCE"),
        ("mlx5_3", "RoCE"),
        ("mlx5_4", "IB"),
    }
    assert data["ib_link_layer"] == "mixed" and data["ib_oob_interfaces"][0]["name"] == "bond0.526"
    assert data["nnodes"] == 2 and data["init_complete"] is True and data["connected_all_rings"] is True
    assert data["unparsed"]["count"] == 0


def test_bad_lines_are_counted_not_raised():
    lines = [
        "host:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via",  # cut mid-line
        "host:1:2 [0] NCCL INFO Something NCCL added in a future release",
        "NCCL INFO without any header",
        "host:1:2 [0] NCCL",
        b"host:1:2 [0] NCCL INFO NCCL version 2.20.3+cuda12.3 \xff",
        None,  # not a string: read as the text "None"
    ]
    data = parse_nccl_log(lines).to_dict()
    assert data["unparsed"]["count"] == 4 and len(data["unparsed"]["examples"]) == 4
    assert data["version"] == "2.20.3" and data["line_count"] == 6


def test_prefixes_from_other_tools_are_not_taken_for_host_names():
    lines = [
        "  | 2024-05-01T12:34:56.789Zip-10-0-0-1:123:456 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>",
        "[3] ip-10-0-0-2:124:456 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.2<0>",
        "\x1b[0m ip-10-0-0-3:125:456 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.3<0>",
        '"ip-10-0-0-4:126:456 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.4<0>',
        "[1,5]<stderr>:10-0-0-5:127:456 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.5<0>",
    ]
    data = parse_nccl_log(lines).to_dict()
    assert data["hosts"] == ["10-0-0-5", "ip-10-0-0-1", "ip-10-0-0-2", "ip-10-0-0-3", "ip-10-0-0-4"]


def test_stored_warnings_are_capped_with_a_count_of_the_rest():
    lines = (f"h:{i}:1 [0] misc.cc:1 NCCL WARN something odd {i}" for i in range(250))
    data = parse_nccl_log(lines).to_dict()
    assert len(data["warnings"]) == 200 and data["warnings_omitted"] == 50


def test_carriage_returns_and_crlf_end_lines():
    text = "step 1\rstep 2\rh:1:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\r\nh:1:2 [0] NCCL INFO rank 0 nranks 4\r\n"
    data = parse_nccl_text(text).to_dict()
    assert data["version"] == "2.21.5" and data["nranks"] == 4 and data["line_count"] == 4


def test_two_ranks_with_one_bus_id_are_reported_as_duplicates():
    text = "\n".join(
        [
            "n1:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
            "n1:2:2 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
            "n1:1:1 [0] NCCL INFO comm 0xa rank 0 nranks 2 cudaDev 0 busId 1b000 - Init COMPLETE",
            "n1:2:2 [0] NCCL INFO comm 0xb rank 1 nranks 2 cudaDev 0 busId 1b000 - Init COMPLETE",
        ]
    )
    assert diagnosis_of(text, "none", 1)["duplicate-gpu"] == "error"
    # Without addresses the two "n1" could be two machines sharing a host name.
    without_addresses = "\n".join(line for line in text.splitlines() if "Bootstrap" not in line)
    assert "duplicate-gpu" not in diagnosis_of(without_addresses, "none", 2)


def diagnosis_of(text: str, promise: str, nodes: int, expected_ranks=None) -> dict[str, str]:
    return codes(
        diagnose(parse_nccl_text(text), promised_network=promise, node_count=nodes, expected_ranks=expected_ranks)
    )


# -- diagnosis ------------------------------------------------------------------------------------------


def test_socket_fallback_on_an_ib_spec():
    findings = diagnose(parsed("65"), promised_network="ib", node_count=2)
    (fallback,) = [f for f in findings if f.code == "socket-fallback"]
    assert fallback.severity == "error" and "No device found" in fallback.message and "IBext" in fallback.message
    assert findings[0].severity == "error"  # errors come first
    assert diagnosis("62", "roce", 2)["socket-fallback"] == "error"


def test_socket_fallback_over_ipoib_is_named():
    (fallback,) = [
        f for f in diagnose(parsed("62"), promised_network="ib", node_count=2) if f.code == "socket-fallback"
    ]
    assert "IP over InfiniBand" in fallback.message


def test_transport_matching_the_promise_is_all_good():
    assert diagnosis("44", "ib", 2)["network-as-promised"] == "info"
    assert diagnosis("13", "roce", 2)["network-as-promised"] == "info"
    assert diagnosis("22", "socket", 2)["network-as-promised"] == "info"
    assert "network-as-promised" not in diagnosis("65", "ib", 2)


def test_roce_and_infiniband_mismatches():
    assert diagnosis("16", "ib", 2)["infiniband-expected-roce-used"] == "warning"
    assert diagnosis("68", "roce", 2)["roce-expected-infiniband-used"] == "warning"


def test_no_socket_interface_found():
    found = diagnosis("61", "ib", 2)
    assert found["no-socket-interface"] == "error" and found["nccl-error"] == "error"
    text = (
        "h:1:1 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth9\n"
        "h:1:1 [0] bootstrap.cc:50 NCCL WARN Bootstrap : no socket interface found"
    )
    (finding,) = [
        f
        for f in diagnose(parse_nccl_text(text), promised_network="socket", node_count=2)
        if f.code == "no-socket-interface"
    ]
    assert "NCCL_SOCKET_IFNAME=eth9" in finding.message


def test_wrong_interfaces_loopback_veth_and_link_local():
    assert diagnosis("10", "socket", 2)["loopback-interface"] == "error"
    assert "loopback-interface" not in diagnosis("10", "socket", 1)
    assert diagnosis("17", "ib", 2)["virtual-interface-used"] == "error"  # NET/Socket/1 is the veth
    assert diagnosis("37", "roce", 2)["virtual-interface-listed"] == "warning"
    assert diagnosis("32", "ib", 2)["link-local-address"] == "warning"


def test_duplicate_gpu_and_all_ranks_on_one_host():
    found = diagnosis("38", "ib", 2)
    assert found["duplicate-gpu"] == "error" and found["single-host"] == "error"
    assert "warn-duplicate-gpu" not in found
    assert "single-host" not in diagnosis("44", "ib", 2)


def test_init_incomplete_abort_and_rank_counts():
    assert diagnosis("28", "roce", 1)["init-incomplete"] == "error"
    assert "init-incomplete" not in diagnosis("46", "ib", 2)
    assert diagnosis("31", "ib", 2)["communicator-aborted"] == "error"
    assert diagnosis("07", "socket", 64, expected_ranks=128)["fewer-ranks"] == "error"
    assert "fewer-ranks" not in diagnosis("07", "socket", 64, expected_ranks=64)
    assert diagnosis("49", "socket", 1, expected_ranks=2)["more-ranks"] == "warning"


def test_warnings_are_explained_in_plain_words():
    cases = {
        ("02", "ib"): "warn-ibv-call-failed",
        ("16", "roce"): "warn-ibv-call-failed",
        ("14", "ib"): "warn-connection-refused",
        ("20", "socket"): "warn-topology-realpath",
        ("08", "ib"): "warn-libfabric",
        ("04", "ib"): "warn-shm-cuda-failure",
    }
    for (prefix, promise), code in cases.items():
        findings = {f.code: f for f in diagnose(parsed(prefix), promised_network=promise, node_count=2)}
        assert findings[code].severity == "error", prefix
        assert len(findings[code].message) > 80, prefix
    shm = [f for f in diagnose(parsed("04"), promised_network="ib", node_count=2) if f.code == "warn-shm-cuda-failure"]
    assert "--shm-size" in shm[0].message
    assert diagnosis("40", "ib", 2)["warn-sharp"] == "warning"
    assert diagnosis("58", "socket", 2)["warn-fastsocket"] == "warning"
    assert diagnosis("17", "socket", 2)["connect-retries"] == "warning"


def test_network_not_shown_other_networks_and_single_node():
    assert diagnosis("26", "ib", 2)["network-not-shown"] == "warning"
    assert diagnosis("43", "ib", 2)["unexpected-network"] == "warning"
    assert diagnosis("53", "ib", 1) == {"single-node": "info", "init-incomplete": "error"}
    assert diagnosis("23", "socket", 2)["intra-node-over-network"] == "warning"
    assert diagnosis("02", "ib", 2)["no-gdrdma"] == "info"


def test_diagnosis_accepts_the_stored_dict_and_checks_the_promise():
    stored = json.loads(json.dumps(parsed("65")))
    assert codes(diagnose(stored, promised_network="IB", node_count=2)) == diagnosis("65", "ib", 2)
    with pytest.raises(ValueError):
        diagnose(stored, promised_network="infiniband", node_count=2)
    assert diagnosis_of("", "none", 1) == {"network-as-promised": "info"}


def test_mixed_nccl_versions_are_flagged():
    text = "NCCL version 2.18.3+cuda12.1\nNCCL version 2.19.3+cuda12.3\n"
    assert diagnosis_of(text, "none", 1)["mixed-versions"] == "warning"


# -- the management command --------------------------------------------------------------------


def test_command_prints_one_json_object():
    out = io.StringIO()
    call_command("ncclsummary", str(log_path("44")), "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data == parsed("44")


def test_command_prints_text_by_default():
    out = io.StringIO()
    call_command("ncclsummary", str(log_path("28")), stdout=out)
    assert "NCCL version: 2.18.3 (CUDA 12.2)" in out.getvalue()
    assert "RoCE" in out.getvalue()


def test_command_reads_undecodable_bytes(tmp_path):
    path = tmp_path / "job.log"
    path.write_bytes(b"\xff\xfeh:1:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n\x80\x81 garbage\n")
    out = io.StringIO()
    call_command("ncclsummary", str(path), "--json", stdout=out)
    assert json.loads(out.getvalue())["version"] == "2.21.5"


def test_command_rejects_a_missing_file(tmp_path):
    with pytest.raises(CommandError, match="No such log file"):
        call_command("ncclsummary", str(tmp_path / "missing.log"))


def test_an_endless_line_is_cut_and_the_next_line_still_read(tmp_path):
    path = tmp_path / "bar.log"
    path.write_text("#" * 300_000 + "\nh:1:2 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n", encoding="utf-8")
    data = parse_nccl_file(path).to_dict()
    assert data["line_count"] == 2 and data["version"] == "2.21.5"


def test_pathological_long_lines_take_linear_time():
    """Regexes that backtrack would take minutes (or forever) on these 64K-character lines."""
    import time

    n = 30_000
    messages = [
        "1 : " + "A/" * n + " x",
        "Channel 00/0 : 1[1] -> 2[2] via a" + " " * n + "x",
        "Channel 00/0 : 1[1] -> 2[2] via NET/IB/0" + "/a" * n + " x",
        "Bootstrap : Using " + "a:" * n,
        "NET/IB : Using " + "a" * n,
        "CUDA Dev 0, IB Ports : " + "a" * n,
        "NCCL_X set to " + " " * n + "x",
        "Using network x" + " " * n + "y",
        "Channel 00/24 :" + " 1" * n + " x",
        "Trees [0] " + "1/" * n + "->",
        "a." * n + " x",
    ]
    lines = [f"h:1:2 [0] NCCL INFO {message}" for message in messages]
    lines.append("h:1:2 [0] x.cc:1 NCCL WARN " + "Got completion " * (n // 8))
    started = time.perf_counter()
    data = parse_nccl_log(lines).to_dict()
    assert time.perf_counter() - started < 5
    assert data["unparsed"]["parser_errors"] == 0
