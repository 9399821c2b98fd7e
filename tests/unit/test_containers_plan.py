"""What a worker's container is asked for: the spec's limits, no privilege, the job's names, the node's GPUs;
and a node without the container runtime is out of service."""

import pytest

from jobs.launch.plan import KeyPair, gpu_devices_for, pids_limit_for, plan_job
from jobs.models import Node, workers_launch_values
from jobs.runtime.containers import run_argv
from jobs.runtime.node_health import Probe, record
from tests.unit.fake_lock_holder import lock_holder

pytestmark = pytest.mark.django_db


@pytest.fixture
def planned(make_job):
    job = make_job(name="train", node_count=2, bind_args="-bind-to none -map-by slot")
    job.engine_version.image = "localhost/training-console/mpi:test"
    job.engine_version.save()
    workers = []
    for index in range(2):
        node = Node.objects.create(name=f"node-{index}", address=f"10.0.0.{index + 1}", spec=job.spec,
                                   health={"gpus": [{"model": "A100", "memory_mib": 81920}] * 8, "cdi": True})
        workers.append(job.workers.create(index=index, node=node, node_name=node.name, address=node.address,
                                          hostname=f"{job.dns_name}-worker-{index}"))
    keys = KeyPair("private", "public")
    return job, plan_job(job.launch_values(), workers_launch_values(workers), work_root="/srv/jobs", user="ma-user",
                         preferred_uid=1000, client_key=keys, host_key=keys)


def test_a_worker_container_gets_the_specs_limits_the_jobs_names_and_no_privilege(planned):
    job, plan = planned
    argv = run_argv(plan, plan.workers[1])

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert argv[:3] == ["podman", "run", "--detach"] and value("--name") == plan.workers[1].container_name
    assert value("--name").startswith(f"tc-{job.pk}-w1-")
    assert (value("--network"), value("--hostname")) == ("host", f"{job.dns_name}-worker-1")
    assert f"{job.dns_name}-worker-0.{job.dns_name}:10.0.0.1" in argv and f"{job.dns_name}-worker-0:10.0.0.1" in argv
    assert value("--memory") == str(job.spec.memory_gb * 1024**3) == value("--memory-swap")
    assert value("--cpus") == str(job.spec.cpu_cores) and value("--shm-size") == str(job.spec.memory_gb * 1024**3 // 2)
    assert (value("--user"), value("--cap-drop"), value("--security-opt")) == ("1000:1000", "ALL", "no-new-privileges")
    security = [argv[index + 1] for index, word in enumerate(argv) if word == "--security-opt"]
    assert security == ["no-new-privileges", f"seccomp=/srv/jobs/{job.dns_name}/worker-1/seccomp.json"]
    assert value("--pids-limit") == str(pids_limit_for(job.spec.cpu_cores, job.spec.processes_per_node))
    assert int(value("--pids-limit")) < 32768 // 4, "a share of the node's PIDs, not all of them"
    assert f"training-console.disk-limit={job.spec.disk_gb * 1024**3}" in argv
    volumes = [argv[index + 1] for index, word in enumerate(argv) if word == "--volume"]
    assert volumes == [f"/srv/jobs/{job.dns_name}/worker-1/home:/home/ma-user:rw,nosuid,nodev",
                       f"/srv/jobs/{job.dns_name}/worker-1/cache:/cache:rw,nosuid,nodev"], "home, and /cache as on the reference"
    assert argv[-6:] == ["localhost/training-console/mpi:test", "/usr/sbin/sshd", "-D", "-e", "-f",
                         "/home/ma-user/.sshd/sshd_config"]
    assert "--device" not in argv, "a CPU spec gets no GPU"


def test_each_worker_container_has_a_name_of_its_own(planned):
    _job, plan = planned
    names = [worker.container_name for worker in plan.workers]
    assert len(set(names)) == 2 and all(len(name.rsplit("-", 1)[1]) == 8 for name in names)


def test_gpus_are_given_by_their_cdi_names_only_where_a_cdi_spec_exists():
    assert gpu_devices_for(8, 8, True) == ("nvidia.com/gpu=all",)
    assert gpu_devices_for(2, 8, True) == ("nvidia.com/gpu=0", "nvidia.com/gpu=1")
    assert gpu_devices_for(8, 8, False) == (), "without a CDI spec no GPU can be given"
    assert gpu_devices_for(0, 8, True) == ()


def test_a_gpu_spec_gives_each_worker_its_nodes_gpus(planned):
    job, _plan = planned
    job.spec.gpu_count, job.spec.gpu_model = 8, "NVIDIA-A100"
    job.spec.save()
    keys = KeyPair("private", "public")
    plan = plan_job(job.launch_values(), workers_launch_values(job.workers.select_related("node").order_by("index")),
                    work_root="/srv/jobs", user="ma-user", preferred_uid=1000, client_key=keys, host_key=keys)
    argv = run_argv(plan, plan.workers[0])
    assert argv[argv.index("--device") + 1] == "nvidia.com/gpu=all"


def test_a_node_without_podman_is_not_ready_and_says_why(make_job):
    node = Node.objects.create(name="bare", address="10.0.0.9", spec=make_job().spec)
    result = record(node, Probe(node.pk, facts={"cpu_cores": 2, "memory_gb": 4.0, "podman": None, "containers": []}))
    node.refresh_from_db()
    assert not result.ready and node.state == Node.State.NOT_READY
    assert node.state_message == "podman, the container runtime jobs run in, is not installed"


JOB_ROOT = "/srv/jobs/"  # the planned fixture's work root: the node has nothing below it yet


class FakeNode:
    """A node's SSH side (the one boundary a unit test fakes): what was run, and the image it holds."""

    def __init__(self, holds_image: bool):
        self.holds_image = holds_image
        self.commands: list[str] = []
        self.folders: dict[str, int] = {}  # made over SFTP: path -> mode

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        return None

    async def run(self, command, check=False, timeout=None):
        from types import SimpleNamespace

        self.commands.append(command)
        if command.startswith("podman run") and not self.holds_image:
            return SimpleNamespace(exit_status=125, stdout="", stderr="Error: localhost/training-console/mpi:test: image not known")
        if command.startswith("podman image exists"):
            return SimpleNamespace(exit_status=0 if self.holds_image else 1, stdout="", stderr="")
        if command.startswith("podman load"):
            self.holds_image = True
        return SimpleNamespace(exit_status=0, stdout="c0ffee\n", stderr="")

    async def create_process(self, command):
        self.commands.append(command)
        return lock_holder(self.commands)

    def start_sftp_client(self):
        node = self

        class Sftp:
            async def isdir(self, path):
                return path in node.folders or not path.startswith(JOB_ROOT)

            async def mkdir(self, path):
                node.folders[path] = 0o700  # as an sftp-server told `-u 077` would make it

            async def chmod(self, path, mode):
                node.folders[path] = mode

            async def __aenter__(self):
                return self

            async def __aexit__(self, *exc_info):
                return None

            async def put(self, local, remote, progress_handler=None):
                if progress_handler:  # as asyncssh reports a copy's progress: the bytes copied of the file's
                    progress_handler(local.encode(), remote.encode(), 16, 16)

        return Sftp()


@pytest.mark.parametrize("holds_image", [True, False])
def test_a_node_is_asked_for_the_image_only_when_starting_the_container_says_it_lacks_it(
        planned, holds_image, monkeypatch, settings, tmp_path):
    import asyncio

    from jobs.runtime import node_images, preparation

    _, plan = planned
    node = FakeNode(holds_image)
    archive = tmp_path / "images" / node_images.archive_name_of(plan.image)
    archive.parent.mkdir()
    archive.write_bytes(b"an image archive")
    settings.IMAGES_DIR = str(archive.parent)

    async def connected(_target):
        return node

    async def port_open(_worker, _port):
        return None

    async def report(*_progress):
        return None

    monkeypatch.setattr(preparation, "connect", connected)
    monkeypatch.setattr(preparation, "_wait_for_port", port_open)
    code = tmp_path / "code.tar"
    code.write_bytes(b"")
    started = asyncio.run(preparation.prepare_worker(plan, plan.workers[0], code, report))

    podman = [command.split()[1] for command in node.commands if command.startswith("podman")]
    # (The image is looked for again once the node's lock on bringing it is held: another may have brought it.)
    assert podman == (["run"] if holds_image else ["run", "image", "image", "load", "run"])
    assert started.container_id == "c0ffee" and plan.workers[0].workdir in node.folders
    workdir = plan.workers[0].workdir
    # Every folder above the worker's can be passed through by the job's uid; the worker's is root's alone while it
    # holds the job's keys as uploaded (prepare-workdir.sh opens it to the job once they are laid out).
    assert {mode for path, mode in node.folders.items() if path != workdir} == {0o755}
    assert node.folders[workdir] == 0o700
