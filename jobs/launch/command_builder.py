"""The background command of an MPI job, built in one place for the form preview and the launch.

Pure: it takes plain values and returns plain values, so the preview a user sees while typing
is, by construction, the command the launcher runs.

The shape is the reference platform's:

    mpirun -np ${OPENMPI_NP} -hostfile ${OPENMPI_HOST_FILE_PATH} -mca plm_rsh_args "-p ${SSHD_PORT}"
      -tune ${TUNE_ENV_FILE} ${OPENMPI_BIND_ARGS} ${OPENMPI_X_ARGS} ${OPENMPI_MCA_ARGS}
      ${OPENMPI_EXTRA_ARGS} python <boot file> <job parameters>

One deliberate difference: the reference writes the tune file as `NAME=value` lines, which Open MPI
4.1 silently ignores. We write `-x NAME` lines instead; mpirun then forwards each variable's value
from its own environment verbatim, which is the reference's intent (worker-0's variables reach
every rank) made to work.
"""

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

JOB_DIR = "/home/ma-user/user-job-dir"
HOSTFILE_PATH = "/home/ma-user/.mpi/hostfile"
TUNE_FILE_PATH = "/home/ma-user/.mpi/tune-env"

# Options the platform sets itself; a user who passed them in OPENMPI_EXTRA_ARGS would silently
# change how many processes run or where, which the reference forbids.
RESERVED_MPIRUN_OPTIONS = {
    "-np", "--np", "-n", "-c", "--n",
    "-hostfile", "--hostfile", "-machinefile", "--machinefile", "-H", "-host", "--host",
    "-tune", "--tune",
}
RESERVED_MCA_PARAMS = {"plm_rsh_args", "plm_rsh_agent", "orte_default_hostfile"}

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PARAM_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class CommandError(ValueError):
    """A value the command cannot be built from; `field` names the input that is wrong."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class LaunchInputs:
    processes_per_node: int
    worker_hostnames: Sequence[str]
    sshd_port: int
    python: str
    code_dir_name: str
    boot_file: str
    parameters: Sequence[tuple[str, str]] = ()
    worker0_env: Mapping[str, str] = field(default_factory=dict)
    bind_args: str = "-bind-to none -map-by slot"
    x_args: str = ""
    mca_args: str = ""
    extra_args: str = ""
    tune_prefixes: Sequence[str] = ("MA_", "SHARED_", "S3_", "PATH", "VC_WORKER_", "SCC", "CRED")


@dataclass(frozen=True)
class LaunchCommand:
    template: str
    argv: list[str]
    expanded: str
    variables: dict[str, str]
    hostfile: str
    tune_file: str
    working_dir: str


def split_args(field_name: str, text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as error:
        raise CommandError(field_name, f"cannot be split into arguments: {error}") from None


def validate_extra_args(text: str) -> list[str]:
    args = split_args("extra_args", text)
    for position, arg in enumerate(args):
        option = arg.split("=", 1)[0]
        if option in RESERVED_MPIRUN_OPTIONS:
            raise CommandError("extra_args", f"{option} is set by the platform and cannot be changed")
        if option in {"-mca", "--mca", "-gmca", "--gmca"} and position + 1 < len(args):
            if args[position + 1] in RESERVED_MCA_PARAMS:
                raise CommandError("extra_args", f"the MCA parameter {args[position + 1]} is set by the platform")
    return args


def boot_file_path(code_dir_name: str, boot_file: str) -> str:
    """The boot file's absolute path in the container, refusing anything that leaves the code directory."""
    cleaned = boot_file.strip()
    parts = [part for part in cleaned.split("/") if part not in ("", ".")]
    if not parts or cleaned.startswith("/") or ".." in parts:
        raise CommandError("boot_file", "must be a path inside the code directory, such as train.py")
    if not parts[-1].endswith(".py"):
        raise CommandError("boot_file", "must be a Python file (.py)")
    return f"{JOB_DIR}/{code_dir_name}/" + "/".join(parts)


def parameter_args(parameters: Iterable[tuple[str, str]]) -> list[str]:
    args = []
    for name, value in parameters:
        if not PARAM_NAME_RE.match(name):
            raise CommandError("parameters", f"parameter name {name!r} must be 1-64 of letters, digits, '-' and '_'")
        args.append(f"--{name}={value}")
    return args


def tune_file_text(worker0_env: Mapping[str, str], prefixes: Sequence[str]) -> str:
    """`-x NAME` for each of worker-0's non-empty variables whose name starts with a tune prefix."""
    names = [
        name
        for name, value in worker0_env.items()
        if value != "" and ENV_NAME_RE.match(name) and any(name.startswith(prefix) for prefix in prefixes)
    ]
    return "".join(f"-x {name}\n" for name in sorted(names))


def hostfile_text(worker_hostnames: Sequence[str], processes_per_node: int) -> str:
    return "".join(f"{host} slots={processes_per_node}\n" for host in worker_hostnames)


def build_launch_command(inputs: LaunchInputs) -> LaunchCommand:
    if inputs.processes_per_node < 1:
        raise CommandError("spec", "the spec gives no process per node")
    if not inputs.worker_hostnames:
        raise CommandError("node_count", "a job needs at least one node")
    np = inputs.processes_per_node * len(inputs.worker_hostnames)
    boot_path = boot_file_path(inputs.code_dir_name, inputs.boot_file)
    bind = split_args("bind_args", inputs.bind_args)
    x = split_args("x_args", inputs.x_args)
    mca = split_args("mca_args", inputs.mca_args)
    extra = validate_extra_args(inputs.extra_args)
    params = parameter_args(inputs.parameters)
    python = split_args("python", inputs.python) or ["python"]

    variables = {
        "OPENMPI_NP": str(np),
        "OPENMPI_HOST_FILE_PATH": HOSTFILE_PATH,
        "SSHD_PORT": str(inputs.sshd_port),
        "TUNE_ENV_FILE": TUNE_FILE_PATH,
        "OPENMPI_BIND_ARGS": inputs.bind_args,
        "OPENMPI_X_ARGS": inputs.x_args,
        "OPENMPI_MCA_ARGS": inputs.mca_args,
        "OPENMPI_EXTRA_ARGS": inputs.extra_args,
    }
    argv = [
        "mpirun",
        "-np", str(np),
        "-hostfile", HOSTFILE_PATH,
        "-mca", "plm_rsh_args", f"-p {inputs.sshd_port}",
        "-tune", TUNE_FILE_PATH,
        *bind, *x, *mca, *extra,
        *python, boot_path, *params,
    ]
    program = shlex.join([*python, boot_path, *params])
    template = (
        'mpirun -np ${OPENMPI_NP} -hostfile ${OPENMPI_HOST_FILE_PATH} -mca plm_rsh_args "-p ${SSHD_PORT}" '
        "-tune ${TUNE_ENV_FILE} ${OPENMPI_BIND_ARGS} ${OPENMPI_X_ARGS} ${OPENMPI_MCA_ARGS} "
        "${OPENMPI_EXTRA_ARGS} " + program
    )
    return LaunchCommand(
        template=template,
        argv=argv,
        expanded=shlex.join(argv),
        variables=variables,
        hostfile=hostfile_text(inputs.worker_hostnames, inputs.processes_per_node),
        tune_file=tune_file_text(inputs.worker0_env, inputs.tune_prefixes),
        working_dir=f"{JOB_DIR}/{inputs.code_dir_name}",
    )
