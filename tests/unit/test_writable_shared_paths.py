"""A writable shared file system (jobs.models.SharedPath with writable set): each user writes in a folder of their
own, the only part of it their jobs see. Submission refuses another user's folder where it was typed; the plan
mounts the owner's folder, writable where train_url lies in it; the node makes that folder, and never where a
link stands (the SSH boundary faked by a connection that runs the command here; the real nodes are in
tests/integration/test_object_storage.py)."""

import asyncio
import os
import re
import stat
from dataclasses import replace
from types import SimpleNamespace

import pytest
from django.core.exceptions import ValidationError

from jobs.launch.plan import KeyPair, SharedMounts, SshTarget, WorkerValues, plan_job
from jobs.models import SharedPath
from jobs.runtime.containers import JOB_UID, run_argv
from jobs.runtime.shared_mounts import make_own_folders
from jobs.runtime.ssh import NodeError
from tests.unit.test_forms import catalog  # noqa: F401 - a fixture, found by name
from tests.unit.test_shared_path_check import HereConnection
from tests.unit.test_slurm_client import job_values

pytestmark = pytest.mark.django_db


@pytest.fixture
def scratch(db):
    return SharedPath.objects.create(name="scratch", path="/mnt/scratch", writable=True)


@pytest.fixture
def datasets(db):
    return SharedPath.objects.create(name="datasets", path="/mnt/datasets")


def test_each_user_has_a_folder_of_their_own_named_by_their_number_and_name(scratch):
    assert scratch.user_folder(3, "Alice.B") == "/mnt/scratch/user-3-alice-b"
    assert scratch.user_folder(4, "alice_b") == "/mnt/scratch/user-4-alice-b"


def test_a_shared_file_system_inside_another_or_around_one_is_refused(scratch):
    with pytest.raises(ValidationError, match="overlaps the shared file system at /mnt/scratch"):
        SharedPath(name="inner", path="/mnt/scratch/inner").clean()
    SharedPath.objects.create(name="team", path="/mnt/pool/team")
    with pytest.raises(ValidationError, match="overlaps the shared file system at /mnt/pool/team"):
        SharedPath(name="around", path="/mnt/pool").clean()
    SharedPath(name="apart", path="/mnt/scratch2").clean()
    scratch.clean()  # itself is no overlap


def test_the_owners_folder_is_mounted_writable_where_train_url_lies_in_it_and_read_only_where_only_inputs_do(
        make_job, owner, scratch, datasets):
    own = scratch.user_folder(owner.pk, owner.username)
    job = make_job(parameters=[{"name": "data_url", "value": f"{own}/data"}, {"name": "train_url", "value": f"{own}/runs/1/"}])
    assert job.shared_mounts() == SharedMounts(read_only=(), writable=(own,))
    job = make_job(parameters=[{"name": "data_url", "value": "/mnt/datasets/mnist"},
                               {"name": "data_url_1", "value": f"{own}/extra"}])
    assert job.shared_mounts() == SharedMounts(read_only=("/mnt/datasets", own), writable=())


def test_nothing_of_another_users_folder_nor_a_read_only_train_url_is_mounted(make_job, teammate, scratch, datasets):
    theirs = scratch.user_folder(teammate.pk, teammate.username)
    job = make_job(parameters=[{"name": "data_url", "value": f"{theirs}/data"},
                               {"name": "train_url", "value": "/mnt/datasets/out"}])
    assert job.shared_mounts() == SharedMounts()


def test_the_containers_mount_the_owners_folder_writable_and_a_read_only_one_read_only_at_their_own_paths():
    node = SshTarget("node-a", "10.0.0.1", 22, "root", "key")
    values = replace(job_values(), parameters=(("data_url", "/mnt/datasets/mnist"), ("train_url", "/mnt/scratch/user-3-a/run")),
                     shared_mounts=SharedMounts(read_only=("/mnt/datasets",), writable=("/mnt/scratch/user-3-a",)))
    plan = plan_job(values, [WorkerValues(index=0, address="10.0.0.1", hostname="job-12-worker-0", node=node)],
                    work_root="/srv/jobs", user="ma-user", preferred_uid=1000, client_key=KeyPair("private", "public"),
                    host_key=KeyPair("private", "public"))
    argv = run_argv(plan, plan.workers[0])
    assert "/mnt/scratch/user-3-a:/mnt/scratch/user-3-a:rw,nosuid,nodev" in argv
    assert "/mnt/datasets:/mnt/datasets:ro,nosuid,nodev" in argv
    assert "--train_url=/mnt/scratch/user-3-a/run" in plan.command


@pytest.mark.parametrize(("field", "where", "words"), [
    ("data_url", "/mnt/scratch/user-{other}/data", "your jobs see your own folder only, /mnt/scratch/user-{own}"),
    ("train_url", "/mnt/scratch/user-{other}/out", "your jobs see your own folder only"),
    ("train_url", "/mnt/scratch", "your jobs see your own folder only"),
    ("train_url", "/mnt/scratch/user-{own}/../user-{other}", "Write the path plainly"),
    ("train_url", "/mnt/datasets/out", "/mnt/datasets/out is on the shared file system datasets, which jobs only read"),
])
def test_a_path_the_job_could_not_use_is_refused_on_the_field_it_was_typed_in(
        catalogue, api, owner, teammate, scratch, datasets, field, where, words):
    names = {"own": f"{owner.pk}-{owner.username}", "other": f"{teammate.pk}-{teammate.username}"}
    response = api.post("/api/v1/training-jobs", {"name": "t", "engine": "MPI", "code_dir": "gpu-train",
                                                 "boot_file": "train.py", "spec": "cpu", "node_count": 2,
                                                 field: where.format(**names)}, format="json")
    assert response.status_code == 400, response.content
    assert words.format(**names) in " ".join(response.json()[field]), response.json()


def test_a_path_in_the_owners_folder_and_an_input_on_a_read_only_one_are_taken(catalogue, api, owner, scratch, datasets):
    own = scratch.user_folder(owner.pk, owner.username)
    response = api.post("/api/v1/training-jobs", {"name": "t", "engine": "MPI", "code_dir": "gpu-train",
                                                 "boot_file": "train.py", "spec": "cpu", "node_count": 2,
                                                 "data_url": "/mnt/datasets/mnist/", "train_url": f"{own}/runs/1"},
                        format="json")
    assert response.status_code == 201, response.content


def node_worker():
    return SimpleNamespace(node=SimpleNamespace(label="node-1"), rootless=False)


def make(*folders: str) -> None:
    asyncio.run(make_own_folders(HereConnection(), node_worker(), folders))


# The node's side runs as root there (or as the root of the Slurm user's namespace), and so here.
as_on_a_node = pytest.mark.skipif(os.geteuid() != 0, reason="the node's root makes the folders")


@pytest.fixture
def shared_root(tmp_path):
    root = tmp_path / "scratch"
    root.mkdir(mode=0o755)
    return root


@as_on_a_node
def test_the_node_makes_the_owners_folder_for_the_jobs_uid_closed_to_others_and_keeps_what_is_in_it(shared_root):
    folder = shared_root / "user-3-alice"
    make(str(folder))
    made = folder.stat()
    assert stat.S_ISDIR(made.st_mode) and stat.S_IMODE(made.st_mode) == 0o700 and made.st_uid == JOB_UID
    (folder / "kept.txt").write_text("x")
    folder.chmod(0o777)
    make(str(folder))
    assert (folder / "kept.txt").read_text() == "x" and stat.S_IMODE(folder.stat().st_mode) == 0o700


@as_on_a_node
def test_no_folder_is_made_where_a_link_stands_nor_below_a_link(shared_root, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (shared_root / "user-3-alice").symlink_to(elsewhere)
    with pytest.raises(NodeError, match=re.escape("making your folder") + ".*it is there and is not a folder"):
        make(str(shared_root / "user-3-alice"))
    (tmp_path / "linked-root").symlink_to(elsewhere)
    with pytest.raises(NodeError, match=re.escape(f"it leads to {elsewhere} on this node (a link)")):
        make(str(tmp_path / "linked-root" / "user-3-alice"))
    assert not list(elsewhere.iterdir())


@as_on_a_node
def test_a_folder_someone_else_made_first_is_not_taken_for_the_users(shared_root):
    planted = shared_root / "user-3-alice"
    planted.mkdir(mode=0o777)
    os.chown(planted, 4321, 4321)
    with pytest.raises(NodeError, match="it belongs to uid 4321, not to the jobs' uid 1000"):
        make(str(planted))
    assert planted.stat().st_uid == 4321


@as_on_a_node
@pytest.mark.parametrize(("mode", "owner"), [(0o1777, 0), (0o775, 0), (0o755, 4321)])
def test_no_users_folder_is_made_in_a_file_system_folder_others_than_root_may_write(shared_root, mode, owner):
    shared_root.chmod(mode)
    os.chown(shared_root, owner, owner)
    with pytest.raises(NodeError, match=f"it may be written by others than root \\(owner uid {owner}, mode {mode:o}\\)"):
        make(str(shared_root / "user-3-alice"))
    assert not (shared_root / "user-3-alice").exists()


def test_the_forms_preview_shows_the_command_for_a_train_url_in_the_owners_folder(catalog, owner, scratch):  # noqa: F811
    from jobs.pages.preview import preview
    from jobs.submission.forms import TrainingJobForm, page_data
    from tests.unit.test_forms import page_post

    own = scratch.user_folder(owner.pk, owner.username)
    shown = preview(TrainingJobForm(page_data(page_post(catalog, train_url=f"{own}/run")), user=owner))
    assert shown["ready"], shown["errors"]
    assert shown["expanded"].endswith(f"--train_url={own}/run --lr=0.01 --epochs=3")
