"""The background command, as the reference platform writes it, built from plain values."""

import shlex

import pytest

from jobs.launch.command_builder import (
    CommandError,
    LaunchInputs,
    boot_file_path,
    build_launch_command,
    tune_file_text,
    validate_extra_args,
)
from jobs.models import LauncherDefaults

REFERENCE_X_ARGS = LauncherDefaults._meta.get_field("x_args").default
REFERENCE_MCA_ARGS = LauncherDefaults._meta.get_field("mca_args").default
TRICKY = "a b 'c' \"d\" $(id) ; x `id` \\ ção"


def inputs(**overrides) -> LaunchInputs:
    values = dict(
        processes_per_node=8,
        worker_hostnames=["job-1-worker-0", "job-1-worker-1"],
        sshd_port=30001,
        python="python",
        code_dir_name="gpu-train",
        boot_file="train.py",
        parameters=[("datasets", "obs://modelarts-train-test/gpu-train/data_url_0")],
        x_args=REFERENCE_X_ARGS,
        mca_args=REFERENCE_MCA_ARGS,
    )
    values.update(overrides)
    return LaunchInputs(**values)


def test_the_command_has_the_reference_shape_and_defaults():
    command = build_launch_command(inputs())
    assert command.expanded == (
        "mpirun -np 16 -hostfile /home/ma-user/.mpi/hostfile -mca plm_rsh_args '-p 30001' "
        "-tune /home/ma-user/.mpi/tune-env -bind-to none -map-by slot "
        "-x LD_LIBRARY_PATH -x HOROVOD_MPI_THREADS_DISABLE=1 -x NCCL_DEBUG=INFO "
        "-x NCCL_SOCKET_IFNAME=ib0,bond0,eth0 -x NCCL_SOCKET_FAMILY=AF_INET -x NCCL_IB_DISABLE=0 "
        "-mca pml ob1 -mca btl '^openib' -mca plm_rsh_no_tree_spawn true "
        "python /home/ma-user/user-job-dir/gpu-train/train.py "
        "--datasets=obs://modelarts-train-test/gpu-train/data_url_0"
    )
    assert command.template.startswith(
        'mpirun -np ${OPENMPI_NP} -hostfile ${OPENMPI_HOST_FILE_PATH} -mca plm_rsh_args "-p ${SSHD_PORT}" '
        "-tune ${TUNE_ENV_FILE} ${OPENMPI_BIND_ARGS} ${OPENMPI_X_ARGS} ${OPENMPI_MCA_ARGS} ${OPENMPI_EXTRA_ARGS} python "
    )
    assert command.variables["OPENMPI_NP"] == "16"
    assert command.working_dir == "/home/ma-user/user-job-dir/gpu-train"


def test_np_is_processes_per_node_times_nodes():
    assert build_launch_command(inputs(processes_per_node=2, worker_hostnames=["a"])).variables["OPENMPI_NP"] == "2"
    assert build_launch_command(inputs(processes_per_node=3, worker_hostnames=["a", "b", "c"])).argv[2] == "9"


def test_the_hostfile_has_one_line_per_worker_with_its_slots():
    command = build_launch_command(inputs(processes_per_node=2))
    assert command.hostfile == "job-1-worker-0 slots=2\njob-1-worker-1 slots=2\n"


def test_a_tricky_parameter_is_one_argument_and_quoting_keeps_it_literal():
    command = build_launch_command(inputs(parameters=[("tricky", TRICKY)]))
    assert command.argv[-1] == f"--tricky={TRICKY}"
    assert shlex.split(command.expanded) == command.argv


def test_the_tune_file_carries_worker0_variables_with_the_reference_prefixes_and_drops_empty_ones():
    env = {"MA_NUM_HOSTS": "2", "MA_EMPTY": "", "SHARED_X": "1", "S3_Y": "y", "PATH": "/bin", "PATHEXT": "z",
           "VC_WORKER_HOSTS": "h", "VC_TASK_INDEX": "0", "SCC_A": "a", "CRED_TOKEN": "t", "HOME": "/h", "USER_VAR": "u"}
    text = tune_file_text(env, ["MA_", "SHARED_", "S3_", "PATH", "VC_WORKER_", "SCC", "CRED"])
    assert text.splitlines() == [
        "-x CRED_TOKEN", "-x MA_NUM_HOSTS", "-x PATH", "-x PATHEXT", "-x S3_Y", "-x SCC_A", "-x SHARED_X", "-x VC_WORKER_HOSTS",
    ]


@pytest.mark.parametrize("extra", ["-np 4", "--hostfile h", "-H a,b", "-mca plm_rsh_args x", "-mca plm_rsh_args x y",
                                   "-tune f", "-x 'unclosed"])
def test_extra_args_cannot_override_what_the_platform_sets(extra):
    with pytest.raises(CommandError) as caught:
        validate_extra_args(extra)
    assert caught.value.field == "extra_args"


def test_extra_args_are_appended_after_the_mca_args():
    command = build_launch_command(inputs(extra_args="-x FOO=1 --report-bindings"))
    position = command.argv.index("--report-bindings")
    assert command.argv[position - 2:position] == ["-x", "FOO=1"]
    assert command.argv.index("plm_rsh_no_tree_spawn") < position


@pytest.mark.parametrize("boot_file", ["../escape.py", "/etc/passwd.py", "a/../../b.py", "", "train.sh"])
def test_a_boot_file_outside_the_code_directory_or_not_python_is_refused(boot_file):
    with pytest.raises(CommandError) as caught:
        boot_file_path("gpu-train", boot_file)
    assert caught.value.field == "boot_file"


def test_a_boot_file_in_a_subfolder_is_fine():
    assert boot_file_path("code", "./src/main.py") == "/home/ma-user/user-job-dir/code/src/main.py"


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("extra_args", "--mca x '$(touch /tmp/f)'", "x"),
        ("extra_args", "--prefix /tmp/ompi", "--prefix"),
        ("extra_args", "--mca orte_rsh_agent /bin/sh", "orte_rsh_agent"),
        ("extra_args", "-x OMPI_MCA_plm_rsh_agent=/tmp/a", "OMPI_MCA_plm_rsh_agent"),
        ("extra_args", "python /tmp/other.py", "python"),
        ("mca_args", "-mca pml ob1 -mca btl_tcp_if_include 'eth0 $(id)'", "btl_tcp_if_include"),
        ("x_args", "-x LD_PRELOAD=/tmp/evil.so", "LD_PRELOAD"),
        ("bind_args", "-bind-to none -map-by slot:oversubscribe", "slot:oversubscribe"),
    ],
)
def test_the_launch_checks_again_what_holds_for_everyone_on_every_option_field(field, value, named):
    # A job keeps the defaults and the arguments it was created with; the launch does not trust them blindly.
    with pytest.raises(CommandError) as caught:
        build_launch_command(inputs(**{field: value}))
    assert caught.value.field == field
    assert named in caught.value.message


def test_the_launch_runs_what_an_administrator_allowed_at_submission():
    # Not on the built-in list, so only an administrator's line let it through the form; the launch,
    # which has no list, keeps to what holds for everyone and runs it.
    command = build_launch_command(inputs(extra_args="--display-topo --timeout 600 --mca coll_hcoll_enable 1"))
    assert command.argv[-6:-3] == ["--mca", "coll_hcoll_enable", "1"]


def test_an_x_value_with_spaces_and_shell_words_is_one_argument():
    command = build_launch_command(inputs(extra_args="-x " + shlex.quote(f"TRICKY={TRICKY}")))
    assert command.argv[command.argv.index("-x", command.argv.index("plm_rsh_no_tree_spawn")) + 1] == f"TRICKY={TRICKY}"
    assert shlex.split(command.expanded) == command.argv


def test_a_parameter_name_ending_in_a_line_break_is_refused():
    with pytest.raises(CommandError):
        build_launch_command(inputs(parameters=[("lr\n", "0.1")]))
