"""What the platform gives each worker of a job: its environment variables and its view of the job's hosts.

Pure functions; node preparation writes their results into each container.
"""

from collections.abc import Mapping, Sequence

from jobs.launch.command_builder import JOB_DIR

MA_HOME = "/home/ma-user"
# Shipped in every container's bundle; Open MPI's orted runs each rank through it (see node_scripts/rank-agent.sh).
RANK_AGENT_PATH = f"{MA_HOME}/.mpi/rank-agent.sh"
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


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
) -> dict[str, str]:
    """The variables of one worker, in the order they are applied: engine, platform, then the user's.

    The user's come last so they win, except for `MA_` names, which the form refuses.
    """
    count = len(worker_addresses)
    platform = {
        "HOME": MA_HOME,
        "PATH": DEFAULT_PATH,
        "LD_LIBRARY_PATH": "/usr/local/lib",
        "MA_HOME": MA_HOME,
        "MA_JOB_DIR": JOB_DIR,
        "MA_LOG_DIR": f"{MA_HOME}/modelarts/log",
        "MA_CURRENT_IP": worker_addresses[worker_index],
        "MA_NUM_GPUS": str(gpus_per_node),
        "MA_TASK_NAME": "worker",
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
