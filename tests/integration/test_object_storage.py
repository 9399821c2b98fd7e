"""Data in and out through a real object store (SeaweedFS): s3:// and obs:// as data_url and train_url.

The store is the tests' own SeaweedFS, registered as `make run` registers its own; the jobs run on the
local cluster's nodes in real containers. What is checked is what a user of the reference platform expects:
the input is on every worker before the program starts, read-only; the output is in the bucket after the
job, and up to the stop after a stop; a rerun fetches nothing again; another user's bucket is out of reach.
"""

import hashlib
import json
import shutil
import stat
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from jobs.management.commands.localstore import register
from jobs.models import JobStatus, Node, SharedPath, Worker
from jobs.object_store.client import ObjectStore
from jobs.results.outputs import outputs_root
from tests.conftest import RUN_ID, TEAM_BUCKET, TEAM_READER
from tests.integration.helpers import log_text, submit_program, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

DATASET = {"train/a.csv": b"x,y\n1,2\n" * 50, "train/b.csv": b"x,y\n3,4\n" * 70, "labels.txt": b"cat\ndog\n"}


@pytest.fixture
def storage(console, object_store):
    return register(object_store.endpoint, object_store.state)


@pytest.fixture
def bucket(storage, owner):
    """The owner's own bucket, with a small dataset under datasets/toy/."""
    name = storage.user_bucket(owner.pk, owner.username)
    store = ObjectStore(storage.access())
    store.create_bucket(name)
    for key, body in DATASET.items():
        store.client.put_object(Bucket=name, Key=f"datasets/toy/{key}", Body=body)
    return name


def steps(count: int, every: float = 0.0) -> list[dict[str, str]]:
    return [{"name": "steps", "value": str(count)}, {"name": "every", "value": str(every)}]


def wait_for_line(job, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log_text(job):
        assert time.monotonic() < deadline, log_text(job)
        time.sleep(0.3)


def keys_under(storage, bucket: str, prefix: str) -> dict[str, int]:
    return {item.key.removeprefix(prefix): item.size for item in ObjectStore(storage.access()).objects(bucket, prefix, 1000)}


def test_a_two_node_job_reads_its_s3_input_on_every_worker_and_leaves_its_output_in_the_obs_bucket(
        api, storage, bucket):
    job = submit_program(api, "data_roundtrip.py", data_url=f"s3://{bucket}/datasets/toy/",
                         train_url=f"obs://{bucket}/runs/first/")
    job = wait_for(job, [JobStatus.COMPLETED], timeout=240)
    log = log_text(job)

    for rank in range(4):
        assert f"rank {rank} read 3 files from /home/ma-user/modelarts/inputs/data_url_0/" in log, log
        assert f"rank {rank} cannot write into its input: Read-only file system" in log, log
    assert log.count("digest ") == 4 and len({line.split("digest ")[1].split()[0]
                                              for line in log.splitlines() if "digest " in line}) == 1
    assert f"(DATA_URL=s3://{bucket}/datasets/toy/)" in log
    assert "--data_url=/home/ma-user/modelarts/inputs/data_url_0/" in job.command
    assert "--train_url=/home/ma-user/modelarts/outputs/train_url_0/" in job.command

    assert keys_under(storage, bucket, "runs/first/") == {f"checkpoints/step-{step}.txt": len(f"weights after step {step}\n") * 100 for step in range(3)}
    assert job.outputs_summary["state"] == "uploaded", job.outputs_summary
    assert sorted(job.output_files.values_list("path", flat=True)) == [f"checkpoints/step-{step}.txt" for step in range(3)]

    # The owner downloads from the bucket through a link the console signs; the bytes never pass through it.
    answer = api.get(f"/api/v1/training-jobs/{job.pk}/outputs/checkpoints/step-0.txt")
    assert answer.status_code == 302 and answer["Location"].startswith(storage.endpoint_url)

    # The store's keys, and the signed URLs made with them, appear nowhere the user or an admin reads.
    access = storage.access()
    client = Client()
    client.force_login(job.owner)
    seen = [job.command, log_text(job), json.dumps(list(job.workers.values()), default=str),
            json.dumps(list(job.events.values()), default=str), json.dumps(job.outputs_summary),
            api.get(f"/api/v1/training-jobs/{job.pk}").content.decode(),
            api.get(f"/api/v1/training-jobs/{job.pk}/outputs").content.decode(),
            client.get(f"/jobs/{job.pk}").content.decode()]
    for text in seen:
        assert access.secret_key not in text and access.access_key not in text and "X-Amz-Signature" not in text


def test_a_further_input_row_is_brought_to_its_own_folder_and_one_with_nothing_stored_is_refused_where_typed(
        api, storage, bucket):
    store = ObjectStore(storage.access())
    for name in ("vocab.txt", "stopwords.txt"):
        store.client.put_object(Bucket=bucket, Key=f"datasets/extra/{name}", Body=name.encode() * 10)
    job = submit_program(api, "data_roundtrip.py", data_url=f"s3://{bucket}/datasets/toy/",
                         parameters=[{"name": "data_url_1", "value": f"obs://{bucket}/datasets/extra/"}, *steps(1)])
    body = {"name": "two-inputs", "engine": "local-mpi4py", "spec": "local-cpu", "node_count": 2,
            "code_dir": "data_roundtrip", "boot_file": "data_roundtrip.py",
            "data_url": f"s3://{bucket}/datasets/toy/"}
    refused = api.post("/api/v1/training-jobs", {**body, "parameters": [
        {"name": "data_url_1", "value": f"obs://{bucket}/datasets/missing/"}]}, format="json")
    assert refused.status_code == 400 and "Nothing is stored under" in str(refused.json()["parameters"]), refused.json()

    job = wait_for(job, [JobStatus.COMPLETED], timeout=240)
    log = log_text(job)

    for rank in range(4):
        assert f"rank {rank} read 3 files from /home/ma-user/modelarts/inputs/data_url_0/" in log, log
        assert (f"rank {rank} read 2 further files (stopwords.txt vocab.txt) from "
                f"/home/ma-user/modelarts/inputs/data_url_1_0/ (DATA_URL_1=obs://{bucket}/datasets/extra/)") in log, log
    assert "--data_url_1=/home/ma-user/modelarts/inputs/data_url_1_0/" in job.command


def test_a_rerun_finds_its_input_in_the_nodes_cache_and_fetches_nothing(api, storage, bucket):
    first = submit_program(api, "data_roundtrip.py", data_url=f"s3://{bucket}/datasets/toy/", parameters=steps(1))
    wait_for(first, [JobStatus.COMPLETED], timeout=240)
    assert "input ready: 3 files" in log_text(first)

    second = submit_program(api, "data_roundtrip.py", name="data-roundtrip-again",
                            data_url=f"s3://{bucket}/datasets/toy/", parameters=steps(1))
    second = wait_for(second, [JobStatus.COMPLETED], timeout=240)
    ready = [line for line in log_text(second).splitlines() if "input ready:" in line]
    assert len(ready) == 2 and all("0 bytes fetched from the store" in line for line in ready), ready


def test_a_stopped_jobs_output_up_to_the_stop_is_in_the_bucket(api, storage, bucket):
    job = submit_program(api, "data_roundtrip.py", data_url=f"s3://{bucket}/datasets/toy/",
                         train_url=f"s3://{bucket}/runs/stopped/", parameters=steps(1000, every=0.5))
    wait_for(job, [JobStatus.RUNNING], timeout=240)
    wait_for_line(job, "saved checkpoint 4", timeout=120)
    # What the program had saved when the stop was asked for (it goes on saving until its container ends).
    last = max(int(line.split()[-1]) for line in log_text(job).splitlines() if "saved checkpoint" in line)
    assert api.post(f"/api/v1/training-jobs/{job.pk}/stop").status_code in (200, 202)
    job = wait_for(job, [JobStatus.TERMINATED], timeout=120)

    saved = keys_under(storage, bucket, "runs/stopped/")
    assert {f"checkpoints/step-{step}.txt" for step in range(last + 1)} <= set(saved), (last, saved)
    assert job.outputs_summary["state"] == "uploaded", job.outputs_summary


def test_an_output_larger_than_a_part_is_uploaded_in_parts_and_joined_whole_in_the_bucket(api, storage, bucket):
    # The tests' Celery worker uploads in parts of 5 MiB (OUTPUT_PART_BYTES): 12 MiB is three of them.
    job = submit_program(api, "large_output.py", node_count=1, train_url=f"s3://{bucket}/runs/large/",
                         parameters=[{"name": "mib", "value": "12"}])
    job = wait_for(job, [JobStatus.COMPLETED], timeout=240)
    [written] = [line.split()[-1] for line in log_text(job).splitlines() if "wrote model.bin sha256" in line]

    store = ObjectStore(storage.access())
    stored = store.client.get_object(Bucket=bucket, Key="runs/large/model.bin")
    assert hashlib.sha256(stored["Body"].read()).hexdigest() == written
    assert stored["ETag"].strip('"').endswith("-3"), stored["ETag"]  # a multipart object's ETag counts its parts
    assert store.open_multipart_uploads(bucket, "runs/large/") == []
    assert job.outputs_summary["state"] == "uploaded", job.outputs_summary


def test_another_users_bucket_is_refused_where_the_url_was_typed_and_their_outputs_cannot_be_fetched(
        api, storage, bucket):
    job = submit_program(api, "data_roundtrip.py", data_url=f"s3://{bucket}/datasets/toy/",
                         train_url=f"s3://{bucket}/runs/private/", parameters=steps(1))
    wait_for(job, [JobStatus.COMPLETED], timeout=240)

    intruder = get_user_model().objects.create_user("intruder", password="intruder-password")
    client = APIClient()
    client.force_authenticate(intruder)
    body = {"name": "steal", "engine": "local-mpi4py", "spec": "local-cpu", "node_count": 1,
            "code_dir": "data_roundtrip", "boot_file": "data_roundtrip.py"}
    answer = client.post("/api/v1/training-jobs", {**body, "data_url": f"s3://{bucket}/datasets/toy/"}, format="json")
    assert answer.status_code == 400
    assert f"Bucket {bucket} is not yours" in str(answer.json()), answer.json()
    answer = client.post("/api/v1/training-jobs", {**body, "train_url": f"obs://{bucket}/runs/overwrite/"}, format="json")
    assert answer.status_code == 400 and "is not yours" in str(answer.json())
    answer = client.post("/api/v1/training-jobs", {**body, "data_url": "gs://somewhere/data/"}, format="json")
    assert answer.status_code == 400 and "gs:// is not a storage this console reads" in str(answer.json())
    answer = api.post("/api/v1/training-jobs", {**body, "name": "empty", "data_url": f"s3://{bucket}/nothing/here/"},
                      format="json")
    assert answer.status_code == 400 and "Nothing is stored under" in str(answer.json())

    # The job is not the intruder's to see, nor its files to download (an admin sees the list, not the bytes).
    assert client.get(f"/api/v1/training-jobs/{job.pk}/outputs/checkpoints/step-0.txt").status_code == 404
    assert not Worker.objects.filter(job__owner=intruder).exists()


@pytest.fixture
def team_bucket(storage):
    """A bucket no console user owns, holding the dataset under toy/, in a store that takes users' own keys: the
    store's second identity (TEAM_READER) may list and read it, and nothing else."""
    storage.users_may_bring_keys = True
    storage.save()
    store = ObjectStore(storage.access())
    store.create_bucket(TEAM_BUCKET)
    for key, body in DATASET.items():
        store.client.put_object(Bucket=TEAM_BUCKET, Key=f"toy/{key}", Body=body)
    return TEAM_BUCKET


def test_a_user_with_keys_of_their_own_reads_a_team_bucket_and_a_user_without_them_is_refused(
        api, owner, storage, team_bucket):
    reader = TEAM_READER.keys
    page = Client()
    page.force_login(owner)
    prefix = f"store-{storage.pk}-"
    answer = page.post(f"/store-keys/{storage.pk}", {prefix + "access_key": reader.access_key,
                                                     prefix + "secret_key": reader.secret_key,
                                                     prefix + "bucket": team_bucket}, follow=True)
    assert "Your keys to the local store are kept, sealed" in answer.content.decode(), answer.content.decode()

    job = submit_program(api, "data_roundtrip.py", data_url=f"s3://{team_bucket}/toy/", parameters=steps(1))
    job = wait_for(job, [JobStatus.COMPLETED], timeout=240)
    log = log_text(job)
    for rank in range(4):
        assert f"rank {rank} read 3 files from /home/ma-user/modelarts/inputs/data_url_0/" in log, log
    browsed = api.get("/api/v1/data", {"url": f"s3://{team_bucket}/toy/"})
    assert browsed.status_code == 200 and {item["name"] for item in browsed.json()["objects"]} == {"labels.txt"}

    newcomer = get_user_model().objects.create_user("newcomer", password="newcomer-password")
    client = APIClient()
    client.force_authenticate(newcomer)
    body = {"name": "borrow", "engine": "local-mpi4py", "spec": "local-cpu", "node_count": 1,
            "code_dir": "data_roundtrip", "boot_file": "data_roundtrip.py", "data_url": f"s3://{team_bucket}/toy/"}
    refused = client.post("/api/v1/training-jobs", body, format="json")
    assert refused.status_code == 400, refused.content
    assert "add your own keys to it on the Object-store keys page" in str(refused.json())
    assert client.get("/api/v1/data", {"url": f"s3://{team_bucket}/toy/"}).status_code == 400

    # The user's keys appear nowhere the user, another user or an admin reads.
    seen = [job.command, log, json.dumps(list(job.workers.values()), default=str),
            json.dumps(list(job.events.values()), default=str), json.dumps(job.outputs_summary),
            api.get(f"/api/v1/training-jobs/{job.pk}").content.decode(), browsed.content.decode(),
            page.get(f"/jobs/{job.pk}").content.decode(), page.get("/store-keys").content.decode(),
            refused.content.decode()]
    for text in seen:
        assert reader.secret_key not in text and reader.access_key not in text and "X-Amz-Signature" not in text


@pytest.fixture
def shared_folder(console):
    """A folder every node of the local cluster sees at the same path (they share this machine's disk, as
    the nodes of a Slurm site share an NFS or Lustre mount)."""
    root = Path(f"/mnt/tc-test-shared-{RUN_ID}")
    shutil.rmtree(root, ignore_errors=True)
    (root / "datasets" / "toy" / "train").mkdir(parents=True)
    for key, body in DATASET.items():
        (root / "datasets" / "toy" / key).write_bytes(body)
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_an_input_on_a_shared_file_system_is_mounted_read_only_not_copied(api, shared_folder):
    SharedPath.objects.create(name="datasets", path=str(shared_folder))
    job = submit_program(api, "data_roundtrip.py", data_url=f"{shared_folder}/datasets/toy", parameters=steps(1))
    job = wait_for(job, [JobStatus.COMPLETED], timeout=240)
    log = log_text(job)
    for rank in range(4):
        assert f"rank {rank} read 3 files from {shared_folder}/datasets/toy" in log, log
        assert f"rank {rank} cannot write into its input: Read-only file system" in log, log
    assert "input ready" not in log, "nothing is fetched for a shared path"
    assert not (shared_folder / "datasets" / "toy" / "scribble.txt").exists()


def test_on_a_writable_shared_file_system_a_job_writes_in_its_owners_folder_and_sees_no_one_elses(
        api, owner, shared_folder):
    # The datasets on a read-only file system of their own; the users' folders on a writable one, where the
    # owner has none yet and someone else has one.
    scratch_root = shared_folder / "scratch"
    scratch_root.mkdir(mode=0o755)
    SharedPath.objects.create(name="datasets", path=str(shared_folder / "datasets"))
    scratch = SharedPath.objects.create(name="scratch", path=str(scratch_root), writable=True)
    (scratch_root / "user-99-someone").mkdir()
    (scratch_root / "user-99-someone" / "secret.txt").write_text("theirs")
    own = Path(scratch.user_folder(owner.pk, owner.username))

    job = submit_program(api, "data_roundtrip.py", data_url=f"{shared_folder}/datasets/toy", train_url=f"{own}/runs/first",
                         parameters=[*steps(2), {"name": "look", "value": str(scratch_root)}])
    job = wait_for(job, [JobStatus.COMPLETED], timeout=240)
    log = log_text(job)
    for rank in range(4):
        assert f"rank {rank} read 3 files from {shared_folder}/datasets/toy" in log, log
        assert f"rank {rank} cannot write into its input: Read-only file system" in log, log
        # The file system's own folder in the container holds the mount point of the owner's folder, alone.
        assert f"rank {rank} sees [{own.name}] in {scratch_root}" in log, log
    made = own.stat()
    assert (made.st_uid, stat.S_IMODE(made.st_mode)) == (1000, 0o700), "made by the node for the jobs' uid, closed"
    written = own / "runs" / "first" / "checkpoints"
    assert sorted(path.name for path in written.iterdir()) == ["step-0.txt", "step-1.txt"]
    assert (written / "step-0.txt").stat().st_uid == 1000
    # Listed on the job's page, not copied into the console.
    assert job.outputs_summary["state"] == "on_shared", job.outputs_summary
    assert sorted(job.output_files.values_list("path", flat=True)) == ["checkpoints/step-0.txt", "checkpoints/step-1.txt"]
    assert not outputs_root(job.pk).exists()
    assert (scratch_root / "user-99-someone" / "secret.txt").read_text() == "theirs"


def test_a_shared_path_that_is_a_link_on_the_node_is_not_mounted_and_the_job_fails_saying_where_it_leads(api, console):
    # A registered path checked by its text only; on the nodes it is a link to /etc, which podman would mount.
    link = Path(f"/mnt/tc-test-link-{RUN_ID}")
    link.unlink(missing_ok=True)
    link.symlink_to("/etc")
    try:
        SharedPath.objects.create(name="linked", path=str(link))
        job = submit_program(api, "data_roundtrip.py", data_url=f"{link}/ssh", parameters=steps(1))
        job = wait_for(job, [JobStatus.FAILED], timeout=240)
    finally:
        link.unlink(missing_ok=True)
    assert f"mounting the shared file system {link}" in job.status_message, job.status_message
    assert "it leads to /etc on this node (a link): it is not mounted" in job.status_message
    assert "rank 0 read" not in log_text(job), "no program ran with the link mounted"


def test_a_job_that_brings_its_train_url_back_resumes_after_the_last_checkpoint_and_uploads_only_the_new_ones(
        api, storage, bucket):
    first = submit_program(api, "data_roundtrip.py", data_url=f"s3://{bucket}/datasets/toy/",
                           train_url=f"s3://{bucket}/runs/resumed/", parameters=steps(2))
    wait_for(first, [JobStatus.COMPLETED], timeout=240)
    store = ObjectStore(storage.access()).client
    before = store.head_object(Bucket=bucket, Key="runs/resumed/checkpoints/step-0.txt")["LastModified"]

    again = submit_program(api, "data_roundtrip.py", name="data-roundtrip-resumed", data_url=f"s3://{bucket}/datasets/toy/",
                           train_url=f"s3://{bucket}/runs/resumed/", parameters=steps(2), predownload=True)
    again = wait_for(again, [JobStatus.COMPLETED], timeout=240)
    log = log_text(again)
    assert "resuming after 2 checkpoint(s)" in log and "saved checkpoint 3" in log, log
    assert any("train_url ready: 2 files" in line for line in log.splitlines()), log
    assert set(keys_under(storage, bucket, "runs/resumed/")) == {f"checkpoints/step-{step}.txt" for step in range(4)}
    assert store.head_object(Bucket=bucket, Key="runs/resumed/checkpoints/step-0.txt")["LastModified"] == before, \
        "what came back unchanged is not uploaded again"
    assert again.outputs_summary["state"] == "uploaded" and again.outputs_summary["total_files"] == 4


def test_bringing_the_output_back_needs_an_object_store_train_url(api, storage, bucket):
    answer = api.post("/api/v1/training-jobs", {
        "name": "no-store", "engine": "local-mpi4py", "spec": "local-cpu", "node_count": 1, "code_dir": "data_roundtrip",
        "boot_file": "data_roundtrip.py", "train_url": "/home/ma-user/outputs", "predownload": True}, format="json")
    assert answer.status_code == 400
    assert answer.json()["predownload"] == ["Bringing the output back needs an s3:// or obs:// train_url."], answer.json()


@pytest.mark.fault("the object store stopped mid-run, then started again",
                   "the job goes on; what failed to upload is uploaded at a later sync; nothing is lost")
def test_an_upload_that_fails_while_the_store_is_away_is_made_at_a_later_sync(api, storage, bucket, object_store):
    job = submit_program(api, "data_roundtrip.py", data_url=f"s3://{bucket}/datasets/toy/",
                         train_url=f"s3://{bucket}/runs/away/", parameters=steps(50, every=0.5))
    wait_for(job, [JobStatus.RUNNING], timeout=240)
    wait_for_line(job, "saved checkpoint 2", timeout=60)
    object_store.kill()
    try:
        time.sleep(5)  # two syncs fail meanwhile; the program goes on writing
    finally:
        object_store.start()
    job = wait_for(job, [JobStatus.COMPLETED], timeout=240)
    assert job.outputs_summary["state"] == "uploaded", job.outputs_summary
    assert set(keys_under(storage, bucket, "runs/away/")) == {f"checkpoints/step-{step}.txt" for step in range(50)}


@pytest.mark.fault("the object store away when the job ends",
                   "the job still ends, its page names the files not saved, its nodes are freed")
def test_a_job_that_ends_while_the_store_is_away_ends_and_says_which_files_were_not_saved(
        api, storage, bucket, object_store, console):
    job = submit_program(api, "data_roundtrip.py", data_url=f"s3://{bucket}/datasets/toy/",
                         train_url=f"s3://{bucket}/runs/lost-store/", parameters=steps(6, every=1))
    wait_for(job, [JobStatus.RUNNING], timeout=240)
    wait_for_line(job, "saved checkpoint 1", timeout=60)
    object_store.kill()
    try:
        job = wait_for(job, [JobStatus.COMPLETED], timeout=240)
    finally:
        object_store.start()
    summary = job.outputs_summary
    assert summary["state"] in ("upload_partial", "upload_failed"), summary
    assert "not saved: checkpoints/step-" in summary["message"], summary
    assert "checkpoints/step-5.txt" in job.output_files.filter(kept=False).values_list("path", flat=True), \
        "the last checkpoint, written while the store was away, is listed as not saved"
    assert not Node.objects.filter(allocated_to__isnull=False).exists()
