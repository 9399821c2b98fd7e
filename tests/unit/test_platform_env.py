"""What each worker of a job is given by the platform."""

from jobs.launch.platform_env import hosts_file_text, worker_environment


def environment(index=1, user_env=None):
    return worker_environment(
        job_dns="train-7", worker_index=index, worker_addresses=["10.0.0.10", "10.0.0.11"], gpus_per_node=8,
        engine_env={"ENGINE_VAR": "e", "MA_NUM_GPUS": "overridden"}, user_env=user_env or {},
    )


def test_each_worker_gets_the_reference_variables():
    env = environment(index=1)
    assert env["MA_CURRENT_IP"] == "10.0.0.11"
    assert env["MA_NUM_GPUS"] == "8"
    assert env["MA_NUM_HOSTS"] == "2"
    assert env["VC_TASK_INDEX"] == "1"
    assert env["VC_WORKER_NUM"] == "2"
    assert env["VC_WORKER_HOSTS"] == "train-7-worker-0.train-7,train-7-worker-1.train-7"
    assert env["MA_CURRENT_INSTANCE_NAME"] == "train-7-worker-1"
    assert env["ENGINE_VAR"] == "e"


def test_the_users_variables_come_last_and_win():
    assert environment(user_env={"PATH": "/opt/bin"})["PATH"] == "/opt/bin"


def test_worker_names_resolve_through_the_jobs_hosts_file():
    text = hosts_file_text("train-7", ["10.0.0.10", "10.0.0.11"])
    assert "10.0.0.10 train-7-worker-0.train-7 train-7-worker-0\n" in text
    assert "10.0.0.11 train-7-worker-1.train-7 train-7-worker-1\n" in text
