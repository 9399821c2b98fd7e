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
