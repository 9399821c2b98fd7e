"""One job cannot take every PID of its node: a thread bomb and a fork bomb, each in a worker's container,
stop at the container's PIDs limit, while the node still forks, answers SSH and its health check, the
console still works, and the job is stopped and torn down cleanly."""

import subprocess

import pytest

from jobs.models import JobStatus, Node, WorkerState
from jobs.runtime.node_health import check_nodes
from tests.integration.helpers import on_node, submit_program, wait_for, wait_for_reports
from tests.security.containment import job_containers, nodes_free_and_ready, timed_on_node

# The bombs' own targets: well past any limit a 2-core spec gets, far below the host's pid_max (32,768).
THREADS, FORKS = 6000, 3000


@pytest.mark.attack("a thread bomb and a fork bomb, each in one worker's container",
                    "each stops at its container's PIDs limit; the node forks, answers SSH and its health check; "
                    "the job stops cleanly")
def test_a_thread_bomb_and_a_fork_bomb_stop_at_the_pids_limit_and_the_node_and_console_keep_working(api, console):
    job = submit_program(api, "attack_thread_bomb.py", parameters=[
        {"name": "threads", "value": str(THREADS)}, {"name": "forks", "value": str(FORKS)},
        {"name": "thread_rank", "value": "0"}, {"name": "fork_rank", "value": "2"}])
    bombs = {report["kind"]: report for report in wait_for_reports(job, "BOMB", 2)}
    job.refresh_from_db()
    first, second = console["cluster"]
    containers = dict(job.workers.values_list("index", "container_name"))
    limits = [int(on_node(node, f"podman container inspect --format '{{{{.HostConfig.PidsLimit}}}}' "
                                f"{containers[index]}").strip()) for index, node in enumerate((first, second))]

    # Both bombs were stopped by the kernel at their container's limit, which is a small share of the node's PIDs.
    assert all(0 < limit <= 32768 // 4 for limit in limits), f"the containers' PIDs limits: {limits}"
    assert bombs["threads"]["reached"] < min(THREADS, limits[0]), bombs
    assert bombs["threads"]["reached"] > limits[0] // 2 and "can't start new thread" in bombs["threads"]["error"], bombs
    assert bombs["forks"]["reached"] < min(FORKS, limits[1]), bombs
    assert bombs["forks"]["reached"] > limits[1] // 2 and "BlockingIOError" in bombs["forks"]["error"], bombs

    # While the bombs hold their PIDs: each node still answers SSH and forks 200 processes of its own.
    for node in (first, second):
        answer, seconds = timed_on_node(node, "for i in $(seq 200); do true & done; wait; echo forked")
        assert answer.strip() == "forked" and seconds < 30, (node.name, answer, seconds)
        print(f"\n{node.name}: SSH and 200 forks in {seconds:.2f} s while the bombs hold their PIDs")
    print(f"PIDs limits {limits}: {bombs['threads']['reached']} threads, {bombs['forks']['reached']} forks")
    # The console's host forks too (on the local cluster it shares the nodes' PIDs), and its checks run.
    assert subprocess.run(["true"], check=False).returncode == 0
    results = check_nodes(Node.objects.all())
    assert [(result.node, result.ready) for result in results] == [(node.name, True) for node in console["nodes"]], results
    assert api.get(f"/api/v1/training-jobs/{job.pk}").status_code == 200

    # The stop still ends the job's containers (the teardown cannot exec into a container at its limit; it
    # removes it all the same) and frees the nodes.
    assert api.post(f"/api/v1/training-jobs/{job.pk}/stop").status_code in (200, 202)
    job = wait_for(job, [JobStatus.TERMINATED], timeout=120)
    assert [job_containers(node, job) for node in (first, second)] == ["", ""]
    assert nodes_free_and_ready() == [(node.name, Node.State.READY, None) for node in console["nodes"]]
    assert set(job.workers.values_list("state", flat=True)) == {WorkerState.STOPPED}, list(job.workers.values("index", "state", "message"))
