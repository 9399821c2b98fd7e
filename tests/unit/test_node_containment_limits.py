"""A job's containment on its node, in its pure parts: the share of the node's PIDs a spec gets, the disk
the worker watch reads and judges, the card a worker ended for its disk gets, and the seccomp profile that
refuses new namespaces."""

import json
from typing import Any

from django.utils import translation

from jobs.launch.plan import PIDS_CEILING, PIDS_FLOOR, pids_limit_for
from jobs.pages.card_words import card_words
from jobs.results.failure_card import FailureFacts, explain_failure
from jobs.runtime.containers import SECCOMP_PROFILE
from jobs.runtime.liveness import Probe, Usage, WorkerWatch, past_disk_limit, read_usage
from jobs.runtime.seccomp import CLONE_NEWNS, CLONE_NEWUSER, ENOSYS, EPERM, NEW_NAMESPACE_FLAGS, job_profile

GIB = 1024**3


def test_the_pids_limit_grows_with_the_specs_cores_or_slots_between_a_floor_and_a_ceiling():
    assert pids_limit_for(1, 1) == PIDS_FLOOR == 1024
    assert pids_limit_for(2, 2) == 1024
    assert pids_limit_for(8, 1) == 2048
    assert pids_limit_for(1, 8) == 2048, "a CPU spec's slots count as cores do"
    assert pids_limit_for(96, 8) == PIDS_CEILING == 8192
    # Well below the smallest pid_max (32,768): the node keeps three quarters of its PIDs for itself.
    assert PIDS_CEILING <= 32768 // 4


def test_the_worker_watch_reads_the_disk_its_node_counted():
    _, usage = read_usage("state=running\ncpu_ns=1 mem=2 limit=3\ndisk=1610612736 disk_limit=1073741824 "
                          "disk_free=80000000000\n")
    assert usage is not None
    assert (usage.disk_bytes, usage.disk_limit_bytes, usage.disk_free_bytes) == (1610612736, GIB, 80000000000)
    _, counted_too_long = read_usage("state=running\ncpu_ns=1 mem=2 limit=3\ndisk= disk_limit=1073741824 disk_free=9\n")
    assert counted_too_long is not None and counted_too_long.disk_bytes is None


def test_a_worker_past_its_disk_limit_or_on_a_node_under_its_reserve_is_ended_and_one_within_both_is_not():
    reserve = 5 * GIB
    within = Usage(disk_bytes=GIB // 2, disk_limit_bytes=GIB, disk_free_bytes=50 * GIB)
    assert past_disk_limit(within, reserve) == ""
    past = past_disk_limit(Usage(disk_bytes=GIB + GIB // 2, disk_limit_bytes=GIB, disk_free_bytes=50 * GIB), reserve)
    assert past == ("it passed its disk limit of 1.00 GiB: its home and its container's own files hold 1.50 GiB")
    short = past_disk_limit(Usage(disk_bytes=GIB // 2, disk_limit_bytes=GIB, disk_free_bytes=4 * GIB), reserve)
    assert short == "it passed its disk limit: its node's disk has 4.00 GiB free, under the 5.00 GiB the node keeps for itself"
    assert past_disk_limit(Usage(disk_bytes=None, disk_limit_bytes=GIB, disk_free_bytes=50 * GIB), reserve) == "", \
        "a count cut short says nothing"
    assert past_disk_limit(Usage(disk_bytes=100 * GIB), reserve) == "", "a container of no limit is not judged"


def test_the_watch_ends_a_running_worker_that_is_past_its_disk_limit(settings):
    watch = WorkerWatch([], on_lost=lambda lost, silent: None, interval=1, lost_after=30)  # type: ignore[arg-type, return-value]
    lost = watch.judge([Probe(0, running=True), Probe(1, running=True, over_limit="it passed its disk limit of 1.00 GiB")],
                       asked_at=99.0, now=100.0)
    assert lost == {1: "it passed its disk limit of 1.00 GiB"}


def test_a_node_is_lost_once_silent_for_lost_after_counted_from_its_last_answered_look(settings):
    watch = WorkerWatch([], on_lost=lambda lost, silent: None, interval=5, lost_after=30)  # type: ignore[arg-type, return-value]
    assert watch.judge([Probe(0, running=True)], asked_at=100.0, now=100.5) == {}
    # Each unanswered look gives up after its timeout; the silence runs from the look that was answered.
    assert watch.judge([Probe(0, unreachable="timed out")], asked_at=105.0, now=110.0) == {}
    assert watch.judge([Probe(0, unreachable="timed out")], asked_at=115.0, now=125.0) == {}
    lost = watch.judge([Probe(0, unreachable="timed out")], asked_at=125.0, now=130.0)
    assert lost == {0: "its node has not answered for 30 s (timed out)"} and watch.unreachable == {0}
    assert watch.judge([Probe(1, gone="its container is gone")], asked_at=130.0, now=131.0) == {1: "its container is gone"}
    assert watch.unreachable == {0}, "a gone container's node answered: its teardown is still tried"


def test_the_card_of_a_worker_ended_for_its_disk_says_disk_limit_not_a_lost_node_and_reads_in_portuguese():
    why = "it passed its disk limit of 1.00 GiB: its home and its container's own files hold 1.50 GiB"
    card = explain_failure(FailureFacts(outcome="failed", exit_code=None, rank_workers=(0, 0, 1, 1),
                                        nodes={0: "node-a", 1: "node-b"}, lost_workers={1: why},
                                        run_message=f"worker-1 (node-b) was lost mid-run: {why}"))
    assert card["kind"] == "disk_limit"
    assert card["title"] == "worker-1 on node-b was stopped at its disk limit"
    assert card["hints"][0] == f"worker-1: {why}"
    with translation.override("pt-br"):
        assert card_words(card["title"]) == "worker-1 em node-b foi parado no seu limite de disco"
        assert card_words(card["hints"][0]).startswith("worker-1: passou do seu limite de disco de 1.00 GiB")


def test_a_worker_lost_otherwise_still_gets_the_lost_node_card():
    card = explain_failure(FailureFacts(outcome="failed", exit_code=None, rank_workers=(0, 1), nodes={1: "node-b"},
                                        lost_workers={1: "its container tc-1-w1-ab is gone"}))
    assert card["kind"] == "node_lost"


def _rules_for(profile: dict, name: str) -> list[dict]:
    return [rule for rule in profile["syscalls"] if name in rule["names"]]


def test_the_shipped_seccomp_profile_refuses_new_namespaces_and_answers_clone3_with_enosys():
    profile = json.loads(SECCOMP_PROFILE.read_text())
    for name in ("clone", "unshare"):
        rules = _rules_for(profile, name)
        allowed = [rule for rule in rules if rule["action"] == "SCMP_ACT_ALLOW"]
        assert [rule["args"] for rule in allowed] == [
            [{"index": 0, "value": NEW_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]], name
        refused = {rule["args"][0]["value"] for rule in rules if rule["action"] == "SCMP_ACT_ERRNO"
                   and rule["errnoRet"] == EPERM}
        assert CLONE_NEWUSER in refused and CLONE_NEWNS in refused and sum(refused) == NEW_NAMESPACE_FLAGS
    assert [(rule["action"], rule["errnoRet"]) for rule in _rules_for(profile, "clone3")] == [("SCMP_ACT_ERRNO", ENOSYS)]
    # Everything else is the default's: threads, fork and MPI need its plain calls.
    plain = {name for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" and not rule["args"]
             for name in rule["names"]}
    assert {"futex", "execve", "wait4", "socket", "mmap", "set_robust_list", "rseq"} <= plain
    assert job_profile(profile) == profile, "the shipped profile is the module's own output"


def test_the_job_profile_takes_clone_and_unshare_out_of_the_defaults_plain_allow():
    default: dict[str, Any] = {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": ENOSYS, "syscalls": [
        {"names": ["read", "clone", "clone3", "unshare", "write"], "action": "SCMP_ACT_ALLOW", "args": []},
        {"names": ["unshare"], "action": "SCMP_ACT_ERRNO", "args": [], "excludes": {"caps": ["CAP_SYS_ADMIN"]}},
    ]}
    profile = job_profile(default)
    assert profile["syscalls"][0]["names"] == ["read", "write"]
    assert len(_rules_for(profile, "unshare")) == 8 and len(_rules_for(profile, "clone")) == 8
    assert default["syscalls"][0]["names"] == ["read", "clone", "clone3", "unshare", "write"], "the default is left as it was"
