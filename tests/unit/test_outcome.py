"""The "why it failed" card from mpirun's words, the ranks' own records and the failing rank's last lines."""

from jobs.results.failure_card import FailureFacts, explain_failure, first_failed_rank, python_exception
from jobs.results.mpirun_report import parse_mpirun_output
from jobs.results.rank_records import RankRecord, describe_end, parse_rank_records

NON_ZERO_EXIT = """--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[13349,1],3]
  Exit code:    1
--------------------------------------------------------------------------""".splitlines()

KILLED = """--------------------------------------------------------------------------
mpirun noticed that process rank 1 with PID 0 on node train-7-worker-0 exited on signal 9 (Killed).
--------------------------------------------------------------------------""".splitlines()

NODE_LOST = """--------------------------------------------------------------------------
ORTE has lost communication with a remote daemon.

  HNP daemon   : [[52812,0],0] on node train-7-worker-0
  Remote daemon: [[52812,0],1] on node train-7-worker-1

This is usually due to either a failure of the TCP network
--------------------------------------------------------------------------""".splitlines()

TRACEBACK = [
    "rank 3 ready",
    "Traceback (most recent call last):",
    '  File "/home/ma-user/user-job-dir/code/train.py", line 17, in <module>',
    "    loss = model(batch)",
    "           ^^^^^^^^^^^^",
    "ValueError: bad batch shape on rank 3",
]


def facts(**fields) -> FailureFacts:
    defaults = {"outcome": "exit", "exit_code": 1, "rank_workers": (0, 0, 1, 1),
                "nodes": {0: "node-a", 1: "node-b"}}
    return FailureFacts(**{**defaults, **fields})


def test_the_teardowns_records_give_each_ranks_exit_code_signal_and_stop():
    output = ("rank-record rank=0 ended=1796002474.0059 pid 4179 stop=TERM \n"
              "rank-record rank=1 ended=1796002473.0059 pid 4182 signal=9 \n"
              "rank-record rank=2 ended=1796002474.0059 pid 4183 stop=TERM signal=15 \n"
              "rank-record rank=3 ended=1796002475.5 pid 9 exit=3 \n"
              "left=0\n")
    records = {record.rank: record for record in parse_rank_records(output)}
    assert records[0] == RankRecord(0, 1796002474.0059, None, None, "TERM")
    assert records[1].signal == 9 and records[1].failed_by_itself
    assert records[2].failed and not records[2].failed_by_itself
    assert records[3].exit_code == 3


def test_words_in_a_record_that_are_not_the_agents_are_ignored():
    records = parse_rank_records("rank-record rank=5 ended= exit=2 left=0 stop=lower evil=1\nrank-record rank=x ended=1 exit=1\n")
    assert records == [RankRecord(5, None, 2, None, "")]


def test_mpirun_names_the_first_rank_that_exited_non_zero():
    report = parse_mpirun_output(NON_ZERO_EXIT)
    assert (report.kind, report.rank, report.exit_code) == ("exit_code", 3, 1)
    assert report.excerpt.startswith("mpirun detected that one or more processes")


def test_mpirun_names_a_rank_killed_by_a_signal_and_its_node():
    report = parse_mpirun_output(KILLED)
    assert (report.kind, report.rank, report.signal, report.node) == ("signal", 1, 9, "train-7-worker-0")


def test_a_lost_daemon_names_the_node_it_ran_on():
    report = parse_mpirun_output(NODE_LOST)
    assert (report.kind, report.node) == ("daemon_lost", "train-7-worker-1")


def test_mpirun_aborts_and_launch_failures_are_recognised():
    abort = parse_mpirun_output(["MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD", "with errorcode 7."])
    assert (abort.kind, abort.rank, abort.exit_code) == ("abort", 2, 7)
    slots = parse_mpirun_output(["There are not enough slots available in the system to satisfy the 8", "slots that were requested by the application:"])
    assert slots.kind == "slots"
    unreachable = parse_mpirun_output(["ssh: connect to host job-worker-1 port 30001: Connection refused"])
    assert (unreachable.kind, unreachable.node) == ("unreachable", "job-worker-1")
    assert parse_mpirun_output(["An ORTE daemon has unexpectedly failed after launch and before"]).kind == "daemon_failed"


def test_the_last_traceback_gives_the_exception_and_its_innermost_frame():
    assert python_exception(TRACEBACK) == ("ValueError: bad batch shape on rank 3",
                                           'File "/home/ma-user/user-job-dir/code/train.py", line 17, in <module>')
    assert python_exception(["all good"]) is None


def test_ends_are_told_in_the_platforms_words():
    assert describe_end(None, 9)[0] == "oom"
    assert describe_end(137, None)[0] == "oom"
    assert describe_end(139, None)[0] == "segfault"
    assert describe_end(None, 11)[1] == "segmentation fault (signal 11, SIGSEGV)"
    assert describe_end(3, None) == ("exit_code", "exit code 3")
    assert describe_end(127, None)[0] == "not_found"


def test_the_first_failure_is_mpiruns_else_the_earliest_rank_that_failed_by_itself():
    records = {0: RankRecord(0, 5.0, None, 15, "TERM"), 1: RankRecord(1, 3.0, 2), 2: RankRecord(2, 2.0, 4)}
    assert first_failed_rank(parse_mpirun_output(NON_ZERO_EXIT), records, None) == 3
    assert first_failed_rank(parse_mpirun_output([]), records, None) == 2
    assert first_failed_rank(parse_mpirun_output([]), {}, 1) == 1


def test_a_raised_exception_gives_a_card_with_the_exception_rank_worker_and_what_the_others_did():
    records = {rank: RankRecord(rank, 10.0, None, None, "TERM") for rank in (0, 1, 2)}
    records[3] = RankRecord(3, 9.0, 1)
    card = explain_failure(facts(mpirun_lines=NON_ZERO_EXIT, records=records, rank_tail=TRACEBACK))
    assert card["kind"] == "exception"
    assert card["title"] == "Rank 3 (worker-1, node-b) raised ValueError: bad batch shape on rank 3"
    assert (card["rank"], card["worker"], card["node"], card["how"]) == (3, 1, "node-b", "exit code 1")
    assert card["last_lines"][-1] == "ValueError: bad batch shape on rank 3"
    assert card["others"] == [{"what": "ended by mpirun (SIGTERM) after rank 3 failed", "ranks": [0, 1, 2]}]


def test_a_rank_killed_for_memory_is_called_so():
    card = explain_failure(facts(exit_code=137, mpirun_lines=KILLED, records={1: RankRecord(1, 1.0, None, 9)}))
    assert card["kind"] == "oom" and card["signal"] == 9
    assert "out-of-memory" in card["how"]
    assert card["others"][0]["what"] == "left no record: ended with its container"


def test_an_nccl_error_is_named_and_points_to_the_nccl_panel():
    tail = ["job-worker-0:12:40 [0] NCCL WARN Call to connect returned Connection refused", *TRACEBACK[1:4],
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error"]
    card = explain_failure(facts(mpirun_lines=NON_ZERO_EXIT, rank_tail=tail, nccl_lines=[tail[0], tail[-1]]))
    assert card["kind"] == "nccl"
    assert "NCCL WARN Call to connect returned Connection refused" in card["title"]
    assert any("NCCL panel" in hint for hint in card["hints"])


def test_a_node_lost_mid_job_and_an_auto_stop_and_a_failed_preparation_each_say_so():
    lost = explain_failure(facts(outcome="abnormal", exit_code=None, mpirun_lines=NODE_LOST))
    assert lost["kind"] == "node_lost" and "train-7-worker-1" in lost["title"]
    unreachable = explain_failure(facts(outcome="abnormal", exit_code=None, lost_workers={1: "node-b: SSH timed out"}))
    assert unreachable["kind"] == "node_lost" and "node-b" in unreachable["title"]
    stopped = explain_failure(facts(outcome="exit", exit_code=143, stop_reason="auto_stop",
                                    stop_message="Stopped by auto stop: the job reached its limit of 2 h"))
    assert (stopped["kind"], stopped["title"]) == ("auto_stop", "Stopped by auto stop: the job reached its limit of 2 h")
    prepared = explain_failure(facts(outcome="failed", exit_code=None, run_message="node-b: SSH to 10.0.0.2:22 failed: timed out"))
    assert prepared["kind"] == "preparation" and "node-b" in prepared["title"]


def test_a_watchdog_stop_lists_the_silent_ranks_among_the_others():
    records = {rank: RankRecord(rank, 1.0, None, 15, "TERM") for rank in range(4)}
    card = explain_failure(facts(outcome="exit", exit_code=143, stop_reason="watchdog", silent_ranks=[2], records=records,
                                 stop_message="Stopped by the watchdog: rank(s) 2 printed nothing for more than 3 s"))
    assert card["kind"] == "watchdog"
    assert {"what": "was silent (suspected hung), then ended by the stop (SIGTERM)", "ranks": [2]} in card["others"]
