"""What the job pages hide: secret-looking values in the command, the tune file and the variables."""

import shlex

from jobs.launch.masking import MASK, mask_shell_text, masked, shown_variables, tune_file_names


def test_cred_variables_and_secret_words_are_masked_and_ordinary_ones_are_not():
    assert masked("CRED_ACCESS", "abc") == MASK
    assert masked("S3_SECRET_ACCESS_KEY", "abc") == MASK
    assert masked("db-password", "abc") == MASK
    assert masked("MA_NUM_HOSTS", "2") == "2"
    assert masked("PATH", "/usr/local/bin:/usr/bin:/bin") == "/usr/local/bin:/usr/bin:/bin"
    assert masked("MONKEY_COUNT", "3") == "3", "only whole words of a name count"


def test_values_that_read_like_keys_are_masked_whatever_their_name():
    assert masked("NOTE", "-----BEGIN OPENSSH PRIVATE KEY-----") == MASK
    assert masked("UPLOAD", "AKIAIOSFODNN7EXAMPLEAKIAIOSFODNN7EXAMPLE") == MASK
    assert masked("NCCL_SOCKET_IFNAME", "ib0,bond0,eth0") == "ib0,bond0,eth0"


def test_ordinary_long_values_are_shown_as_they_are():
    checkpoint = "/home/ma-user/user-job-dir/output/checkpoints/epoch-0012-step-004500.pt"
    assert masked("resume", checkpoint) == checkpoint
    hosts = "mnist-training-2026-12-worker-0.mnist-training-2026-12"
    assert masked("VC_WORKER_HOSTS", hosts) == hosts, "a one-node job's worker host list"
    run = "resnet50_imagenet_lr0.1_bs256_2026_12_01_run3"
    assert masked("run_name", run) == run
    assert masked("data_url", "obs://modelarts-train-test/gpu-train/data_url_0") == "obs://modelarts-train-test/gpu-train/data_url_0"
    shown = mask_shell_text(shlex.join(["python", "train.py", f"--resume={checkpoint}"]))
    assert MASK not in shown


def test_random_key_material_is_masked_whatever_its_name():
    assert masked("UPLOAD", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY") == MASK
    assert masked("DIGEST", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08") == MASK
    assert masked("NOTE", "q8Zr4kT1vB9xN2mW7pL5sD3fH6jK0aQe") == MASK


def test_a_hex_or_uuid_run_id_is_shown_but_the_same_hex_under_another_name_is_still_masked():
    for run_id in ("3f2a9c4e8b7d4e1fa6c05b9d2e8f7a13", "3f2a9c4e-8b7d-4e1f-a6c0-5b9d2e8f7a13",
                   "3f2a9c4e8b7d4e1fa6c05b9d2e8f7a13c0de", "3F2A9C4E8B7D4E1FA6C05B9D2E8F7A13"):
        for name in ("run_id", "RUN_ID", "job-id", "runId", "trace_uuid"):
            assert masked(name, run_id) == run_id, (name, run_id)
        command = shlex.join(["python", "train.py", f"--run_id={run_id}", "--api_key=" + run_id])
        assert mask_shell_text(command) == f"python train.py --run_id={run_id} --api_key={MASK}"
    assert masked("UPLOAD", "3f2a9c4e8b7d4e1fa6c05b9d2e8f7a13") == MASK, "hex under a name that says nothing"
    assert masked("run_id", "q8Zr4kT1vB9xN2mW7pL5sD3fH6jK0aQe") == MASK, "an id name does not excuse non-hex key material"
    assert masked("client_id", "AKIAIOSFODNN7EXAMPLEAKIAIOSFODNN7EXAMPLE") == MASK


def test_a_command_keeps_its_shape_and_loses_only_secret_values():
    command = shlex.join(["mpirun", "-np", "4", "-x", "NCCL_DEBUG=INFO", "-x", "CRED_TOKEN=abc def",
                          "python", "/x/train.py", "--lr=0.1", "--api_key=it's secret"])
    template = 'mpirun -np ${OPENMPI_NP} -mca plm_rsh_args "-p ${SSHD_PORT}" python /x/train.py --lr=0.1 --api_key=plain'

    shown = mask_shell_text(command)

    assert shown == f"mpirun -np 4 -x NCCL_DEBUG=INFO -x CRED_TOKEN={MASK} python /x/train.py --lr=0.1 --api_key={MASK}"
    assert "secret" not in shown and "abc" not in shown
    assert mask_shell_text(template) == template.replace("--api_key=plain", f"--api_key={MASK}")


def test_the_tune_file_shows_names_with_masked_values():
    names = tune_file_names("-x CRED_TOKEN\n-x MA_NUM_HOSTS\n-x PATH\n")

    shown = shown_variables(names, {"CRED_TOKEN": "hunter2", "MA_NUM_HOSTS": "2", "PATH": "/bin"})

    assert [(item.name, item.value, item.is_masked) for item in shown] == [
        ("CRED_TOKEN", MASK, True), ("MA_NUM_HOSTS", "2", False), ("PATH", "/bin", False)]
