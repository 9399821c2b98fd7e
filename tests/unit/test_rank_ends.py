"""A rank that ends on its own while the others go on: what the worker watch reads of the rank agents' records
(the job's own claim, read warily). The real run is in tests/integration/test_faults.py."""

from jobs.runtime.liveness import RankEnd, read_rank_ends, read_usage


def test_the_watch_reads_which_ranks_ended_not_as_0_and_how():
    answer = ("state=running\ncpu_ns=5 mem=10 limit=20\n"
              "rank-ended rank=0 exit=1 at=1764800000\n"
              "rank-ended rank=3 signal=11 at=1764800002\n")
    assert read_rank_ends(answer, 1) == [RankEnd(0, 1, "ended with exit code 1", 1764800000.0),
                                         RankEnd(3, 1, "ended on signal 11", 1764800002.0)]
    state, usage = read_usage(answer)
    assert state == "running" and usage is not None and usage.cpu_ns == 5, "the rank lines are not usage fields"


def test_a_rank_that_ended_as_0_is_read_as_finished_and_not_as_failed():
    answer = "state=running\nrank-ended rank=2 exit=0 at=1764800000\nrank-ended rank=3 exit=00 at=1764800000\n"
    assert read_rank_ends(answer, 1) == [RankEnd(2, 1, "finished with exit code 0", 1764800000.0, finished=True)]


def test_a_forged_or_malformed_rank_line_is_not_taken():
    answer = "\n".join(["rank-ended rank=x exit=1 at=1", "rank-ended rank=0 exit=999 at=1",
                        "rank-ended rank=0 exit=1", "rank-ended rank=1 signal=99 at=1", "rank-ended rank=٣ exit=1 at=1",
                        "rank-ended rank=2 exit=2 at=17648000009999999"])
    assert read_rank_ends(answer, 0) == []


def test_a_rank_ends_time_is_moved_from_the_nodes_clock_to_the_consoles_so_a_skewed_node_keeps_the_grace_whole():
    # The node's clock is 40 s behind the console's: the rank ended 10 s before the answer, by the node's clock.
    answer = "state=running\nrank-ended rank=0 exit=1 at=1764799990\nnode_time=1764800000\n"
    [end] = read_rank_ends(answer, 1, answered_at=1764800040.0)
    assert end.at == 1764800030.0
    assert read_rank_ends(answer, 1)[0].at == 1764799990.0, "without the answer's time, the record's own"
    # Only the last node_time counts (the script's root prints it last), and one that is not a number is none.
    assert read_rank_ends(answer + "node_time=1764800040\n", 1, answered_at=1764800040.0)[0].at == 1764799990.0
    assert read_rank_ends(answer.replace("node_time=1764800000", "node_time=soon"), 1,
                          answered_at=1764800040.0)[0].at == 1764799990.0


def test_the_usage_script_says_the_nodes_clock_last(tmp_path):
    """worker-usage.sh, run here against a container podman does not know: its answer ends with the node's time."""
    import subprocess
    import time

    from jobs.runtime.liveness import USAGE_SCRIPT

    fake = tmp_path / "podman"
    fake.write_text("#!/bin/sh\necho 'true 1'\necho ''\necho ''\necho ''\n")
    fake.chmod(0o755)
    answer = subprocess.run(["sh", "-s", "--", "tc-none"], input=USAGE_SCRIPT, capture_output=True, text=True,
                            env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=30).stdout
    last = answer.strip().splitlines()[-1]
    assert last.startswith("node_time=") and abs(int(last.removeprefix("node_time=")) - time.time()) < 5


def test_a_traceback_marks_its_rank_as_raised_until_the_rank_prints_again():
    from datetime import UTC, datetime

    from jobs.logs.store import StoredLogLine
    from jobs.runtime.monitor import RunMonitor

    async def no_stop(reason, message):
        raise AssertionError("no stop")

    monitor = RunMonitor(1, [0, 0, 1, 1], {0: "a", 1: "b"}, no_stop)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    lines = ["Traceback (most recent call last):", '  File "train.py", line 13, in <module>',
             '    with open("/usr/out", "w") as output:', "         ^^^^^^^^",
             "PermissionError: [Errno 13] Permission denied: '/usr/out'"]
    for seq, text in enumerate(lines, 1):
        monitor._follow_traceback(0, StoredLogLine(seq, 0, 0, "stderr", text, at))
    monitor._follow_traceback(2, StoredLogLine(9, 1, 2, "stdout", "Traceback (most recent call last):", at))
    assert monitor.still_raised(0) and not monitor.still_raised(2), "a traceback on stdout is the program's own print"
    assert list(monitor.raised_news) == [(0, "PermissionError: [Errno 13] Permission denied: '/usr/out'", at)]
    monitor._follow_traceback(0, StoredLogLine(10, 0, 0, "stdout", "step=5 loss=0.1", at))
    assert not monitor.still_raised(0), "a rank that printed again caught it and went on"
