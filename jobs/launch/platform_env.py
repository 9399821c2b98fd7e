"""What the platform gives each worker of a job: its environment variables and its view of the job's hosts.

Pure functions; node preparation writes their results into each container.
"""

import re
from collections.abc import Mapping, Sequence

from django.utils.translation import gettext as _

MA_HOME = "/home/ma-user"
# The code directories' parent in every container (the command builder takes it from here).
JOB_DIR = f"{MA_HOME}/user-job-dir"
# Shipped in every container's bundle; Open MPI's orted runs each rank through it (see node_scripts/rank-agent.sh).
RANK_AGENT_PATH = f"{MA_HOME}/.mpi/rank-agent.sh"
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
DEFAULT_LD_LIBRARY_PATH = "/usr/local/lib"


def worker_hostname(job_dns: str, index: int) -> str:
    return f"{job_dns}-worker-{index}"


def worker_dns_name(job_dns: str, index: int) -> str:
    return f"{worker_hostname(job_dns, index)}.{job_dns}"


def hosts_file_text(job_dns: str, worker_addresses: Sequence[str]) -> str:
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    for index, address in enumerate(worker_addresses):
        lines.append(f"{address} {worker_dns_name(job_dns, index)} {worker_hostname(job_dns, index)}")
    return "\n".join(lines) + "\n"


def worker_environment(
    *,
    job_dns: str,
    worker_index: int,
    worker_addresses: Sequence[str],
    gpus_per_node: int,
    engine_env: Mapping[str, str],
    user_env: Mapping[str, str],
    restart_count: int = 0,
    checkpoint_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The variables of one worker, in the order they are applied: engine, platform, then the user's.

    The user's come last so they win; the names they may not set (see `user_variable_problem`) the form refuses.
    """
    count = len(worker_addresses)
    platform = {
        "HOME": MA_HOME,
        "PATH": DEFAULT_PATH,
        "LD_LIBRARY_PATH": DEFAULT_LD_LIBRARY_PATH,
        "MA_HOME": MA_HOME,
        "MA_JOB_DIR": JOB_DIR,
        "MA_LOG_DIR": f"{MA_HOME}/modelarts/log",
        "MA_CURRENT_IP": worker_addresses[worker_index],
        "MA_NUM_GPUS": str(gpus_per_node),
        "MA_TASK_NAME": "worker",
        # How many times auto restart has run the job again: training code resumes from its checkpoint
        # in train_url when this is above 0.
        "MA_RESTART_COUNT": str(restart_count),
        # The checkpoint contract (jobs.launch.checkpoint_contract): MA_CHECKPOINT_DIR, MA_RESUME_FROM, ...
        **dict(checkpoint_env or {}),
        "MA_NUM_HOSTS": str(count),
        "MA_CURRENT_INSTANCE_NAME": worker_hostname(job_dns, worker_index),
        "VC_TASK_INDEX": str(worker_index),
        "VC_WORKER_NUM": str(count),
        "VC_WORKER_HOSTS": ",".join(worker_dns_name(job_dns, i) for i in range(count)),
        # mpirun tags each output line with its rank ("[1,3]<stdout>:") so the log can say who wrote it;
        # set through the environment so the command keeps the reference's exact shape.
        "OMPI_MCA_orte_tag_output": "1",
        # Each rank runs under a small agent that records its own exit status or signal, since mpirun
        # reports only the first failure; set here too, so the command keeps the reference's shape.
        "OMPI_MCA_orte_fork_agent": RANK_AGENT_PATH,
        # A log page is only live if ranks do not sit on a pipe's block buffer.
        "PYTHONUNBUFFERED": "1",
    }
    return {**dict(engine_env), **platform, **dict(user_env)}


# ---- Names a user's variable may not take ----
#
# A user's variables go into every worker's ~/.ssh/environment, so they reach mpirun, every orted that
# mpirun starts over SSH, the platform's rank agent and every rank, not only the program. So:
# - MA_*, HOME and the VC_* names below are the platform's: set per worker, and what the job's files and
#   SSH keys are found by.
# - OMPI_*, OPAL_*, ORTE_*, PMIX_*, PRTE_* are Open MPI's own settings, refused outright. OMPI_MCA_* ones
#   are MCA parameters of mpirun itself (the platform sets OMPI_MCA_orte_tag_output and
#   OMPI_MCA_orte_fork_agent; others replace the launcher, e.g. OMPI_MCA_plm_rsh_agent), and mpirun puts
#   every one on the remote orted's ssh command line unquoted, where a shell reads it: a value such as
#   "$(touch /tmp/f)" ran on worker-1. An MCA parameter a user may set goes in OPENMPI_EXTRA_ARGS as
#   `--mca NAME VALUE`, where the allow-list and the value check apply.
# - LD_* other than LD_LIBRARY_PATH (LD_PRELOAD, LD_AUDIT, ...) would load code into mpirun, orted, the
#   shells sshd starts and the rank agent that records each rank's end, not only the program;
#   BASH_ENV and ENV are read by every shell the platform starts in the containers.
# - PATH and LD_LIBRARY_PATH may be set, to add entries, as long as they keep the platform's own
#   (where the image's python, orted and libraries are); values are not expanded, so `$PATH` would
#   be taken literally and is refused by the same rule.
PLATFORM_PREFIXES = ("MA_",)
OPEN_MPI_PREFIXES = ("OMPI_", "OPAL_", "ORTE_", "PMIX_", "PRTE_")
PLATFORM_NAMES = frozenset({"VC_TASK_INDEX", "VC_WORKER_NUM", "VC_WORKER_HOSTS"})
SHELL_STARTUP_NAMES = frozenset({"BASH_ENV", "ENV"})
# Variables a user may set only to a list that keeps the platform's entries.
KEEP_ENTRIES = {"PATH": DEFAULT_PATH, "LD_LIBRARY_PATH": DEFAULT_LD_LIBRARY_PATH}
# \Z, not $: `$` would let a name end in a line break, which breaks ~/.ssh/environment.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


def user_variable_problem(name: str, value: str | None = None) -> str | None:
    """Why a user's variable `name` (set to `value`; None: only forwarded, as `-x NAME`) is refused, or None.

    The message completes "NAME: ...".
    """
    if not ENV_NAME.match(name):
        return _("not a valid variable name (letters, digits and '_', not starting with a digit)")
    if name.startswith(PLATFORM_PREFIXES):
        return _("names starting with MA_ are reserved for the platform")
    if name.startswith(OPEN_MPI_PREFIXES):
        return _("names starting with OMPI_, OPAL_, ORTE_, PMIX_ or PRTE_ are Open MPI's own settings, which mpirun "
                 "passes to the nodes' command lines; give an allowed MCA parameter in OPENMPI_EXTRA_ARGS "
                 "(--mca NAME VALUE) instead")
    if name == "HOME":
        return _("set by the platform to %(home)s, where the job's code, its SSH keys and its tune file are") % {"home": MA_HOME}
    if name in PLATFORM_NAMES:
        return _("set by the platform for each worker")
    if name in SHELL_STARTUP_NAMES:
        return _("read by every shell the platform starts in the job's containers")
    if name.startswith("LD_") and name not in KEEP_ENTRIES:
        return _("the dynamic loader's settings would apply to mpirun, orted and the platform's own agents too, "
                 "not only to your program")
    if name in KEEP_ENTRIES and value is not None:
        entries = value.split(":")
        missing = [entry for entry in KEEP_ENTRIES[name].split(":") if entry not in entries]
        if missing:
            return _("must keep the platform's entries %(entries)s (where the image's programs and libraries are); add "
                     "yours before or after them, e.g. /opt/mine:%(entries)s (values are not expanded: $%(name)s stays "
                     "as typed)") % {"entries": KEEP_ENTRIES[name], "name": name}
    return None
