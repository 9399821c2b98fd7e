"""The back office, driven with the test client, against real SSH nodes of a local cluster of its own."""

import asyncio
import os
import re
import shlex
import shutil
import subprocess
import time

import asyncssh
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from console.celery import app as celery_app
from jobs import tasks
from jobs.models import (
    CodeDirectory,
    Engine,
    EngineVersion,
    JobStatus,
    LauncherDefaults,
    Network,
    Node,
    ResourcePool,
    ResourceSpec,
    TrainingJob,
)
from jobs.runtime.image_prefetch import Prefetched, prefetch
from jobs.runtime.node_health import check_nodes, leftover_names, probe_all
from jobs.runtime.ssh import connect
from jobs.submission.forms import TrainingJobForm
from jobs.submission.jobs import submit_job
from tests.integration.helpers import code_dir_from_program
from tests.integration.own_cluster import RUN_ID, own_cluster

NODE_CHANGELIST = "/admin/jobs/node/"
JOB_CHANGELIST = "/admin/jobs/trainingjob/"


@pytest.fixture(scope="module")
def cluster():
    with own_cluster("ah", 81, nodes=2) as own:
        yield own


@pytest.fixture
def health_cluster(cluster):
    yield {"nodes": cluster.nodes}
    # A test may have stopped a node's sshd; the next one finds every node answering again.
    cluster.restart_dead_sshds()


@pytest.fixture
def operator(transactional_db, redis_url):
    return get_user_model().objects.create_superuser("operator", "operator@localhost", "operator-password")


@pytest.fixture
def admin_client(operator):
    client = Client()
    client.force_login(operator)
    return client


@pytest.fixture
def local_cpu(transactional_db):
    # What every local node really has, so that nothing is flagged against it.
    return ResourceSpec.objects.create(name="local-cpu", cpu_cores=1, memory_gb=1, cpu_slots_per_node=1,
                                       network=Network.SOCKET)


def register(local, spec, **fields) -> Node:
    """A node put straight into the database, its host key pinned, as `localcluster up` registers one."""
    values = {"name": local.name, "address": local.address, "ssh_port": local.ssh_port, "ssh_user": local.ssh_user,
              "host_key": local.host_public_key, **fields}
    node = Node(spec=spec, **values)
    node.private_key = local.private_key_path.read_text()
    node.save()
    return node


def node_form(local, spec, **overrides) -> dict:
    data = {"name": local.name, "address": local.address, "ssh_port": local.ssh_port, "ssh_user": local.ssh_user,
            "private_key": local.private_key_path.read_text(), "host_key": "", "spec": spec.pk, "pool": "",
            "enabled": "on", "labels": "", "_save": "Save"}
    data.update(overrides)
    return data


def checked(name: str, since, timeout: float = 90) -> Node:
    """The node once a worker's health check, queued by the admin after `since`, has recorded it (the check
    may well be over before the page's answer is read: it is looked for by its time, not waited to change)."""
    deadline = time.monotonic() + timeout
    while True:
        fresh = Node.objects.filter(name=name).first()
        if fresh is not None and fresh.last_checked_at is not None and fresh.last_checked_at >= since:
            time.sleep(0.5)  # the check writes its facts, then the state: both are in by now
            return Node.objects.get(pk=fresh.pk)
        assert time.monotonic() < deadline, f"no health check of {name} within {timeout} s"
        time.sleep(0.2)


def run_action(client, changelist: str, action: str, objects) -> str:
    response = client.post(changelist, {"action": action, "_selected_action": [obj.pk for obj in objects]},
                           follow=True)
    assert response.status_code == 200
    return response.content.decode()


def local_openmpi_version() -> str:
    first_line = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return re.search(r"Open MPI\)?\s+v?(\S+)", first_line).group(1)


def test_a_node_the_operator_adds_is_checked_over_ssh_by_a_worker_and_is_ready_with_what_it_reported(
        admin_client, health_cluster, local_cpu, celery_worker):
    local = health_cluster["nodes"][0]
    key_text = local.private_key_path.read_text()

    started, since = time.monotonic(), timezone.now()
    response = admin_client.post("/admin/jobs/node/add/", node_form(local, local_cpu, labels="rack=a1\nzone=lab"),
                                 follow=True)
    answered = time.monotonic() - started

    assert response.status_code == 200
    assert "health check of 1 node(s) is queued" in response.content.decode()
    node = checked(local.name, since)
    assert node.display_state == "Ready", node.state_message
    assert node.state_message == "" and "reachable, matches its spec" in node.last_check_message
    assert answered < 5, f"the page waited {answered:.1f} s: the check must not run in the request"
    assert node.host_key == local.host_public_key, "the host key seen on first contact is pinned"
    assert node.last_seen is not None and node.last_checked_at is not None
    assert node.labels == {"rack": "a1", "zone": "lab"}
    facts = node.health
    assert facts["cpu_cores"] == os.cpu_count()
    assert facts["memory_gb"] > 0
    assert "eth0" in facts["interfaces"]
    assert facts["socket_ifnames"]["found"] == ["eth0"]
    assert facts["openmpi"] == local_openmpi_version()
    assert facts["python"].startswith("3.")
    assert facts["gpus"] == [] and facts["rdma"] == []
    # The key is sealed in the database and never rendered back.
    assert node.private_key == key_text
    key_body = key_text.splitlines()[1]
    assert key_body not in node.sealed_private_key
    assert key_body not in admin_client.get(f"/admin/jobs/node/{node.pk}/change/").content.decode()
    listing = admin_client.get(NODE_CHANGELIST).content.decode()
    assert facts["podman"] and f"Podman {facts['podman']}" in listing and ">Ready<" in listing


def test_the_operator_edits_a_node_without_retyping_its_key_and_the_saved_key_is_kept(
        admin_client, health_cluster, local_cpu):
    local = health_cluster["nodes"][0]
    node = register(local, local_cpu)
    change = f"/admin/jobs/node/{node.pk}/change/"
    form = node_form(local, local_cpu, private_key="", host_key=local.host_public_key, labels="gpu=none")

    refused = admin_client.post(change, {**form, "private_key": "not a key"})
    saved = admin_client.post(change, form)

    assert "This is not a usable private key" in refused.content.decode()
    assert saved.status_code == 302
    node.refresh_from_db()
    assert node.labels == {"gpu": "none"}
    assert node.private_key == local.private_key_path.read_text()
    assert node.last_checked_at is None, "nothing about reaching the node changed, so no check ran"


def test_a_node_whose_sshd_is_stopped_becomes_not_ready_with_the_reason(admin_client, health_cluster, cluster,
                                                                       local_cpu, celery_worker):
    local = health_cluster["nodes"][1]
    node = register(local, local_cpu)
    cluster.stop_sshd(local.name)
    since = timezone.now()

    run_action(admin_client, NODE_CHANGELIST, "check_now", [node])

    node = checked(node.name, since)
    page = admin_client.get(NODE_CHANGELIST).content.decode()
    assert node.display_state == "NotReady"
    assert node.state_message == (
        f"{local.name}: SSH to {local.address}:22 failed: connection refused (is sshd running?)")
    assert "connection refused" in page and ">NotReady<" in page


def test_an_address_where_nothing_answers_is_not_ready_within_the_timeout(admin_client, health_cluster, local_cpu):
    local = health_cluster["nodes"][0]
    nobody = register(local, local_cpu, name="nobody", address=f"10.81.{RUN_ID}.200")
    settings.SSH_CONNECT_TIMEOUT, original = 2, settings.SSH_CONNECT_TIMEOUT
    try:
        started = time.monotonic()
        result, = check_nodes([nobody])
        elapsed = time.monotonic() - started
    finally:
        settings.SSH_CONNECT_TIMEOUT = original

    nobody.refresh_from_db()
    assert not result.ready and nobody.state == Node.State.NOT_READY
    assert nobody.state_message.startswith(f"nobody: SSH to 10.81.{RUN_ID}.200:22 failed: ")
    assert elapsed < 2 * 2 + 2, f"the check took {elapsed:.1f} s"


def test_a_node_that_shows_another_host_key_than_the_pinned_one_is_refused(admin_client, health_cluster, local_cpu,
                                                                          celery_worker):
    local = health_cluster["nodes"][0]
    other_key = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode().strip()

    since = timezone.now()
    admin_client.post("/admin/jobs/node/add/", node_form(local, local_cpu, host_key=other_key), follow=True)

    node = checked(local.name, since)
    assert node.display_state == "NotReady"
    assert "the host key does not match the pinned key" in node.state_message
    assert node.host_key == other_key, "a refused key must not replace the pinned one"
    assert "host key does not match" in admin_client.get(NODE_CHANGELIST).content.decode()


def test_what_contradicts_the_spec_is_flagged_in_the_node_list(admin_client, health_cluster, celery_worker):
    promised = ResourceSpec.objects.create(name="v100-ib", gpu_count=8, gpu_model="NVIDIA-V100", cpu_cores=1,
                                           memory_gb=1, network=Network.INFINIBAND)
    node = register(health_cluster["nodes"][0], promised)
    since = timezone.now()

    run_action(admin_client, NODE_CHANGELIST, "check_now", [node])

    node = checked(node.name, since)
    page = admin_client.get(NODE_CHANGELIST).content.decode()
    assert node.display_state == "Ready", "a contradiction is flagged, the node is still reachable"
    assert "⚠ 0 GPU(s) found, the spec promises 8" in page
    assert "⚠ no InfiniBand device on an InfiniBand flavor" in page


def test_the_periodic_check_brings_back_a_node_that_answers_again_and_skips_disabled_ones(health_cluster, local_cpu,
                                                                                         redis_url):
    back = register(health_cluster["nodes"][0], local_cpu, state=Node.State.NOT_READY, state_message="was unreachable")
    disabled = register(health_cluster["nodes"][0], local_cpu, name="disabled", enabled=False)

    tasks.check_nodes()

    back.refresh_from_db()
    disabled.refresh_from_db()
    assert back.display_state == "Ready" and back.state_message == ""
    assert disabled.last_checked_at is None
    entry = settings.CELERY_BEAT_SCHEDULE["check-node-health"]
    assert entry["task"] == "jobs.tasks.check_nodes" and entry["task"] in celery_app.tasks


def probe_facts(node: Node) -> dict:
    """What a health check of the node sees, without recording it."""
    [result] = asyncio.run(probe_all([(node.pk, node.ssh_target())], settings.NODE_WORK_ROOT, []))
    return result.facts or {}


def on_node(local, command: str) -> str:
    """Run a command as root on a local node, over its SSH, as the console would."""
    return subprocess.run(["ssh", "-i", str(local.private_key_path), "-o", "StrictHostKeyChecking=no",
                           "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                           f"root@{local.address}", command], capture_output=True, text=True, check=True).stdout


def tiny_image_on(local, tmp_path) -> str:
    """An image of just /bin/sleep and its libraries, imported into the node's own store."""
    tree = tmp_path / "tiny"
    for source in ("/bin/sleep", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"):
        target = tree / source.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    archive = tmp_path / "tiny.tar"
    subprocess.run(["tar", "-C", str(tree), "-cf", str(archive), "."], check=True)
    on_node(local, f"podman import --quiet {archive} localhost/tiny:1")
    return "localhost/tiny:1"


def test_a_node_holding_an_ended_jobs_container_has_it_removed_by_its_check_and_is_ready_again(
        health_cluster, local_cpu, make_job, tmp_path):
    hosting_local, neighbour_local = health_cluster["nodes"][:2]
    hosting, neighbour = (register(local, local_cpu) for local in (hosting_local, neighbour_local))
    ended = make_job("ended", status=JobStatus.FAILED)
    name = f"tc-{ended.pk}-w0-leftover"
    ended.workers.create(index=0, node=hosting, node_name=hosting.name, address=hosting.address, hostname="w0",
                         container_name=name)
    image = tiny_image_on(hosting_local, tmp_path)
    on_node(hosting_local, f"podman run --detach --name {name} --label training-console.job={ended.pk} {image} /bin/sleep 300")
    try:
        assert leftover_names(probe_facts(hosting), hosting.pk) == [name], "the ended job's container is seen"
        assert leftover_names(probe_facts(neighbour), neighbour.pk) == [], "each node has its own containers"

        check_nodes([hosting, neighbour])

        hosting.refresh_from_db()
        neighbour.refresh_from_db()
        assert hosting.display_state == "Ready", hosting.state_message
        assert name not in on_node(hosting_local, "podman ps -a --format '{{.Names}}'"), "the check removed it"
        assert neighbour.display_state == "Ready"
    finally:
        on_node(hosting_local, f"podman rm --force --time 0 {name} || true")


def test_a_deleted_jobs_leftover_home_is_found_from_its_container_and_removed_with_its_secrets(
        health_cluster, local_cpu, make_job, tmp_path):
    local = health_cluster["nodes"][0]
    node = register(local, local_cpu)
    gone = make_job("deleted-later", status=JobStatus.FAILED)
    name, workdir = f"tc-{gone.pk}-w0-orphan", f"{settings.NODE_WORK_ROOT}/{gone.dns_name}/worker-0"
    image = tiny_image_on(local, tmp_path)
    on_node(local, f"mkdir -p {workdir}/home/.ssh && echo secret-key > {workdir}/home/.ssh/id_ed25519")
    on_node(local, f"podman run --detach --name {name} --label training-console.job={gone.pk} "
                   f"--label training-console.workdir={workdir} {image} /bin/sleep 300")
    gone.delete()  # the job and its workers' rows go; the node still holds the container and the job's home
    try:
        check_nodes([node])

        node.refresh_from_db()
        assert node.display_state == "Ready", node.state_message
        assert name not in on_node(local, "podman ps -a --format '{{.Names}}'")
        assert on_node(local, f"test -e {workdir} && echo left || echo gone").strip() == "gone", \
            "the home with the job's secrets is removed, found from the container's own label"
    finally:
        on_node(local, f"podman rm --force --time 0 {name} || true; rm -rf {workdir}")


def test_the_operator_drains_a_busy_node_and_enables_it_again(admin_client, health_cluster, local_cpu):
    node = register(health_cluster["nodes"][0], local_cpu)

    page = run_action(admin_client, NODE_CHANGELIST, "drain", [node])
    node.refresh_from_db()
    assert node.draining and node.display_state == "Draining" and ">Draining<" in page

    run_action(admin_client, NODE_CHANGELIST, "enable", [node])
    node.refresh_from_db()
    assert not node.draining and node.display_state == "Ready"


def test_the_node_list_filters_by_the_state_it_shows(admin_client, health_cluster, local_cpu, make_job):
    local = health_cluster["nodes"][0]
    register(local, local_cpu, name="idle")
    register(local, local_cpu, name="working", allocated_to=make_job("running", status=JobStatus.RUNNING))
    register(local, local_cpu, name="leaving", draining=True)
    register(local, local_cpu, name="broken", state=Node.State.NOT_READY)
    register(local, local_cpu, name="switched-off", enabled=False)

    def listed(state):
        page = admin_client.get(NODE_CHANGELIST, {"display_state": state}).content.decode()
        return sorted(re.findall(r'class="field-name"><a href="[^"]+">([^<]+)</a>', page))

    assert listed("Ready") == ["idle"]
    assert listed("Busy") == ["working"]
    assert listed("Draining") == ["leaving"]
    assert listed("NotReady") == ["broken", "switched-off"]


def test_every_back_office_page_opens_for_the_operator(admin_client, make_job):
    job = make_job("shown")
    pages = ["/admin/", "/admin/jobs/trainingjob/", f"/admin/jobs/trainingjob/{job.pk}/change/"]
    for model in ("resourcespec", "resourcepool", "node", "engine"):
        pages += [f"/admin/jobs/{model}/", f"/admin/jobs/{model}/add/"]
    pages += [f"/admin/jobs/resourcespec/{job.spec_id}/change/",
              f"/admin/jobs/engine/{job.engine_version.engine_id}/change/"]

    for page in pages:
        assert admin_client.get(page).status_code == 200, page


def test_a_stranger_without_staff_rights_cannot_open_the_back_office(transactional_db):
    stranger = get_user_model().objects.create_user("stranger", password="stranger-password")
    client = Client()
    client.force_login(stranger)

    response = client.get(NODE_CHANGELIST)

    assert response.status_code == 302 and "/admin/login/" in response["Location"]


# ---- Jobs, specs, engines, launcher defaults ----

@pytest.fixture
def owner(transactional_db):
    return get_user_model().objects.create_user("owner", password="owner-password")


@pytest.fixture
def make_job(owner):
    engine = EngineVersion.objects.create(engine=Engine.objects.create(name="MPI"), version="v1")
    code_dir = CodeDirectory.objects.create(name="code", path="/nowhere")
    # No node has this spec, so no dispatcher anywhere can start these jobs behind the test's back.
    spec = ResourceSpec.objects.create(name="nowhere", cpu_cores=1, memory_gb=1)

    def make_job(name, status=JobStatus.PENDING, pool=None, user=None) -> TrainingJob:
        return TrainingJob.objects.create(
            name=name, owner=user or owner, engine_version=engine, code_dir=code_dir, boot_file="train.py",
            spec=spec, pool=pool, status=status, bind_args="", x_args="", mca_args="", tune_prefixes="MA_")

    return make_job


def test_jobs_are_read_only_records_filtered_by_state_pool_and_owner(admin_client, make_job, operator):
    pool = ResourcePool.objects.create(name="team-a", kind=ResourcePool.Kind.DEDICATED)
    queued = make_job("queued-in-team-a", pool=pool)
    make_job("done-elsewhere", status=JobStatus.COMPLETED)
    make_job("operators-own", user=operator)

    by_state = admin_client.get(JOB_CHANGELIST, {"status__exact": "Completed"}).content.decode()
    by_pool = admin_client.get(JOB_CHANGELIST, {"pool__id__exact": pool.pk}).content.decode()
    by_owner = admin_client.get(JOB_CHANGELIST, {"owner__id__exact": operator.pk}).content.decode()

    assert "done-elsewhere" in by_state and "queued-in-team-a" not in by_state
    assert "queued-in-team-a" in by_pool and "done-elsewhere" not in by_pool
    assert "operators-own" in by_owner and "queued-in-team-a" not in by_owner
    today = queued.created_at
    by_date = admin_client.get(JOB_CHANGELIST, {"created_at__year": today.year, "created_at__month": today.month,
                                                "created_at__day": today.day})
    assert by_date.status_code == 200 and "queued-in-team-a" in by_date.content.decode()
    change_page = admin_client.get(f"{JOB_CHANGELIST}{queued.pk}/change/").content.decode()
    assert 'name="_save"' not in change_page and "position 1 in the queue" in change_page
    response = admin_client.post(f"{JOB_CHANGELIST}{queued.pk}/change/", {"name": "renamed", "_save": "Save"})
    assert response.status_code == 403
    assert TrainingJob.objects.get(pk=queued.pk).name == "queued-in-team-a"
    assert admin_client.get(f"{JOB_CHANGELIST}add/").status_code == 403


def test_the_operator_stops_selected_jobs_and_is_told_which_could_not_be(admin_client, make_job):
    queued = make_job("queued")
    done = make_job("done", status=JobStatus.COMPLETED)

    page = run_action(admin_client, JOB_CHANGELIST, "stop_selected", [queued, done])

    assert TrainingJob.objects.get(pk=queued.pk).status == JobStatus.TERMINATED
    assert TrainingJob.objects.get(pk=done.pk).status == JobStatus.COMPLETED
    assert "1 job(s) asked to stop." in page and "Not stoppable: done (Completed)" in page
    assert queued.events.filter(kind="state:Terminated", message__startswith="Stop requested by ").exists(), \
        "who asked is kept, on the stop's own entry"
    assert not queued.events.filter(kind="stop").exists(), "one stop, one entry on the timeline"


def test_the_spec_list_shows_each_flavor_as_the_reference_writes_it(admin_client):
    ResourceSpec.objects.create(name="v100x8", gpu_count=8, gpu_model="NVIDIA-V100", cpu_cores=72, memory_gb=512,
                                network=Network.INFINIBAND)

    page = admin_client.get("/admin/jobs/resourcespec/").content.decode()

    assert "GPU: 8 × NVIDIA-V100 | CPU: 72 cores | Memory: 512 GB" in page


def test_the_operator_adds_an_engine_version_with_its_interpreter_and_environment(admin_client):
    formset = {"versions-TOTAL_FORMS": "1", "versions-INITIAL_FORMS": "0", "versions-MIN_NUM_FORMS": "0",
               "versions-MAX_NUM_FORMS": "1000", "versions-0-version": "horovod_0.22.1-pytorch_1.8.0-cuda_10.2-py_3.7",
               "versions-0-python": "/usr/bin/python3", "_save": "Save"}

    refused = admin_client.post("/admin/jobs/engine/add/", {**formset, "name": "Horovod",
                                                             "versions-0-default_env": '{"1BAD": "x"}'})
    saved = admin_client.post("/admin/jobs/engine/add/", {**formset, "name": "Horovod",
                                                           "versions-0-default_env": '{"NCCL_DEBUG": "INFO"}'})

    assert refused.status_code == 200 and "is not a valid variable name" in refused.content.decode()
    assert saved.status_code == 302
    version = EngineVersion.objects.get(engine__name="Horovod")
    assert (version.python, version.default_env) == ("/usr/bin/python3", {"NCCL_DEBUG": "INFO"})


def test_launcher_defaults_changed_by_the_operator_apply_to_new_jobs_only(admin_client, make_job, owner):
    defaults = LauncherDefaults.current()
    change = f"/admin/jobs/launcherdefaults/{defaults.pk}/change/"
    assert admin_client.get("/admin/jobs/launcherdefaults/").url == change
    form = {"bind_args": defaults.bind_args, "x_args": defaults.x_args + " -x NCCL_IB_HCA=mlx5",
            "mca_args": defaults.mca_args, "tune_prefixes": defaults.tune_prefixes, "sshd_port_min": 40000,
            "sshd_port_max": 40099, "log_cap_bytes": defaults.log_cap_bytes, "watchdog_seconds": defaults.watchdog_seconds,
            "outputs_max_bytes": defaults.outputs_max_bytes,
            "checkpoint_grace_max_seconds": defaults.checkpoint_grace_max_seconds,
            "debug_hold_max_minutes": defaults.debug_hold_max_minutes, "_save": "Save"}

    reserved = admin_client.post(f"/admin/jobs/launcherdefaults/{defaults.pk}/change/", {**form, "mca_args": "-np 64"})
    reversed_range = admin_client.post(f"/admin/jobs/launcherdefaults/{defaults.pk}/change/",
                                       {**form, "sshd_port_min": 40100})
    assert "-np is set by the platform" in reserved.content.decode()
    assert "The range ends before it starts." in reversed_range.content.decode()

    code_dir_from_program("defaults-probe", "probe.py")
    # One node out of service: the jobs are not refused as never runnable, and no dispatcher starts them.
    Node.objects.create(name="parked", address="10.0.0.99", spec=ResourceSpec.objects.get(name="nowhere"),
                        state=Node.State.NOT_READY, state_message="out of service for the test")
    job_form = {"name": "before", "engine": "v1", "code_dir": "defaults-probe", "boot_file": "probe.py",
                "spec": "nowhere", "node_count": 1}
    before = submit_job(_valid(TrainingJobForm(job_form)), owner)

    assert admin_client.post(f"/admin/jobs/launcherdefaults/{defaults.pk}/change/", form).status_code == 302
    after = submit_job(_valid(TrainingJobForm({**job_form, "name": "after"})), owner)

    before.refresh_from_db()
    assert "NCCL_IB_HCA" not in before.x_args and "NCCL_IB_HCA=mlx5" in after.x_args
    assert 40000 <= after.sshd_port <= 40099


def _valid(form):
    assert form.is_valid(), form.errors
    return form


def test_the_capacity_page_counts_nodes_by_state_gpus_and_the_queue_per_pool(admin_client, health_cluster, make_job):
    pool = ResourcePool.objects.create(name="gpu-pool", kind=ResourcePool.Kind.DEDICATED)
    gpu = ResourceSpec.objects.create(name="a100", gpu_count=8, gpu_model="NVIDIA-A100", cpu_cores=96, memory_gb=1024)
    local = health_cluster["nodes"][0]
    running = make_job("running", status=JobStatus.RUNNING, pool=pool)
    for index, fields in enumerate([{}, {}, {"allocated_to": running}, {"draining": True},
                                    {"state": Node.State.NOT_READY}]):
        register(local, gpu, name=f"gpu-{index}", pool=pool, **fields)
    queued_job = make_job("waiting", pool=pool)
    TrainingJob.objects.filter(pk=queued_job.pk).update(spec=gpu, node_count=3)

    page = admin_client.get("/capacity").content.decode()

    section = page[page.index("gpu-pool"):]
    cells = re.findall(r"<td[^>]*>(\d+)</td>", section[section.index("a100:"):])[:8]
    # Ready, Busy, Draining, NotReady, GPUs free, GPUs busy, queued jobs, nodes asked for
    assert cells == ["2", "1", "1", "1", "16", "8", "1", "3"]


def test_an_engine_image_is_brought_to_a_node_that_lacks_it_before_any_job_and_its_page_says_so(
        health_cluster, local_cpu, admin_client, mpi_image):
    local = health_cluster["nodes"][1]
    node = register(local, local_cpu)
    version = EngineVersion.objects.create(engine=Engine.objects.create(name="MPI"), version="prefetched",
                                           image=mpi_image)

    async def on_node(*argv: str) -> int:
        async with await connect(node.ssh_target()) as connection:
            return (await connection.run(shlex.join(argv), check=False)).exit_status

    asyncio.run(on_node("podman", "rmi", "--force", mpi_image))
    assert asyncio.run(on_node("podman", "image", "exists", mpi_image)) == 1

    assert prefetch(node_ids=[node.pk], version_ids=[version.pk]) == [Prefetched(node.name, mpi_image)]
    assert asyncio.run(on_node("podman", "image", "exists", mpi_image)) == 0
    node.refresh_from_db()
    assert node.image_transfer["text"] == f"every engine image is on {node.name}"
    # Once there, it is not copied again: a look is all the next prefetch costs.
    started = time.monotonic()
    assert prefetch(node_ids=[node.pk]) == [Prefetched(node.name, mpi_image)]
    assert time.monotonic() - started < 10
    check_nodes([node])
    page = admin_client.get(f"{NODE_CHANGELIST}{node.pk}/change/").content.decode()
    assert "MPI prefetched: here" in page and f"every engine image is on {node.name}" in page
