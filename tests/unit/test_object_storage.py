"""Object-store data, the pure parts: the URLs users type, where their data is in the container, who may
reach which bucket, what the job page says of an upload, and the node's fetch script against a real HTTP
server (the store's side of the boundary; the real store is in tests/integration/test_object_storage.py)."""

import asyncio
import hashlib
import http.server
import json
import shutil
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from jobs.launch.data_paths import folder_of, object_inputs, object_url_of, program_parameters, url_variables
from jobs.launch.plan import KeyPair, SshTarget, WorkerValues, plan_job
from jobs.models import Storage
from jobs.object_store.access import reach
from jobs.object_store.client import StoreAccess
from jobs.object_store.urls import ObjectUrl, ObjectUrlError, parse_object_url
from jobs.runtime.containers import run_argv
from jobs.runtime.data_in import STAGE_SCRIPT, progress_words
from jobs.runtime.data_out import OutputSync
from tests.unit.test_slurm_client import job_values


def test_s3_and_obs_urls_name_a_bucket_and_a_folder_and_a_plain_path_is_no_url():
    assert parse_object_url("s3://user-3-alice/datasets/mnist/") == ObjectUrl("s3", "user-3-alice", "datasets/mnist/")
    assert parse_object_url(" OBS://user-3-alice/data ").folder_prefix == "data/"
    assert parse_object_url("obs://user-3-alice").folder_prefix == ""
    assert parse_object_url("/cache/output") is None and parse_object_url("outputs") is None


@pytest.mark.parametrize(("text", "words"), [
    ("gs://bucket/data", "gs:// is not a storage this console reads"),
    ("s3://Upper_Case/data", "is not a bucket name"),
    ("s3://ab/data", "is not a bucket name"),
    ("s3://bucket/../other-users", "is not a folder in the bucket"),
    ("s3://bucket/a//b", "is not a folder in the bucket"),
    ("s3://bucket/a\x1b[2Jb", "is not a folder in the bucket"),
])
def test_an_unreadable_object_url_is_refused_saying_why(text, words):
    with pytest.raises(ObjectUrlError, match=words.replace("/", "/")):
        parse_object_url(text)


def test_the_program_gets_the_local_paths_as_the_reference_gives_them_and_the_urls_in_its_environment():
    parameters = (("data_url", "s3://user-1-a/data/"), ("train_url", "obs://user-1-a/out/"), ("lr", "0.1"))
    assert program_parameters(parameters) == (("data_url", "/home/ma-user/modelarts/inputs/data_url_0/"),
                                              ("train_url", "/home/ma-user/modelarts/outputs/train_url_0/"),
                                              ("lr", "0.1"))
    assert url_variables(parameters) == {"DATA_URL": "s3://user-1-a/data/", "TRAIN_URL": "obs://user-1-a/out/"}
    assert program_parameters((("train_url", "/cache/output"),)) == (("train_url", "/cache/output"),)
    assert object_url_of((("train_url", "/cache/output"),), "train_url") == ""


def test_further_inputs_data_url_1_to_9_each_get_a_folder_of_their_own_and_their_url_in_the_environment():
    parameters = (("data_url", "s3://user-1-a/data/"), ("data_url_1", "obs://user-1-a/vocab/"),
                  ("data_url_2", "/mnt/datasets/extra"), ("data_url_10", "s3://user-1-a/not-an-input/"))
    assert program_parameters(parameters) == (
        ("data_url", "/home/ma-user/modelarts/inputs/data_url_0/"),
        ("data_url_1", "/home/ma-user/modelarts/inputs/data_url_1_0/"),
        ("data_url_2", "/mnt/datasets/extra"), ("data_url_10", "s3://user-1-a/not-an-input/"))
    assert url_variables(parameters) == {"DATA_URL": "s3://user-1-a/data/", "DATA_URL_1": "obs://user-1-a/vocab/"}
    assert object_inputs(parameters) == (("data_url", "s3://user-1-a/data/"), ("data_url_1", "obs://user-1-a/vocab/"))
    with pytest.raises(ValueError, match="neither an input"):
        folder_of("data_url_10")

    only_further = plan_of((("data_url_3", "s3://user-1-a/data/"),))
    assert only_further.stages_inputs and "--data_url_3=/home/ma-user/modelarts/inputs/data_url_3_0/" in only_further.command


def plan_of(parameters):
    node = SshTarget("node-a", "10.0.0.1", 22, "root", "key")
    workers = [WorkerValues(index=0, address="10.0.0.1", hostname="job-12-worker-0", node=node)]
    keys = KeyPair("private", "public")
    return plan_job(replace(job_values(), parameters=parameters), workers, work_root="/srv/jobs", user="ma-user",
                    preferred_uid=1000, client_key=keys, host_key=keys)


def test_an_object_store_input_is_mounted_read_only_into_the_container_and_a_path_input_is_not():
    plan = plan_of((("data_url", "s3://user-1-a/data/"),))
    assert "--data_url=/home/ma-user/modelarts/inputs/data_url_0/" in plan.command
    assert plan.workers[0].env["DATA_URL"] == "s3://user-1-a/data/"
    argv = run_argv(plan, plan.workers[0])
    assert "/srv/jobs/job-12/worker-0/inputs:/home/ma-user/modelarts/inputs:ro,nosuid,nodev" in argv

    plain = plan_of((("data_url", "/home/ma-user/user-job-dir/code/data"),))
    assert not plain.stages_inputs and "/home/ma-user/modelarts/inputs" not in " ".join(run_argv(plain, plain.workers[0]))


class FakeStorage:
    name = "local"
    user_bucket_prefix = "user-"
    users_may_bring_keys = False

    def access(self):
        return StoreAccess("http://127.0.0.1:9", "access", "secret")

    def user_bucket(self, user_id, username):
        return Storage(user_bucket_prefix="user-").user_bucket(user_id, username)


def test_with_the_stores_keys_a_user_reaches_their_own_bucket_only():
    assert Storage(user_bucket_prefix="user-").user_bucket(3, "Alice.Smith@example.org") == "user-3-alice-smith-example-org"
    assert reach("s3://user-3-alice/data/", FakeStorage(), 3, "alice").url.bucket == "user-3-alice"
    with pytest.raises(ObjectUrlError, match="Bucket user-3-alice is not yours: in the local store yours is s3://user-4-bob/"):
        reach("s3://user-3-alice/data/", FakeStorage(), 4, "bob")
    with pytest.raises(ObjectUrlError, match="No object store of this console answers to obs://"):
        reach("obs://user-3-alice/data/", None, 3, "alice")


def test_a_storage_answers_to_s3_and_obs_only():
    with pytest.raises(ValidationError, match="Name one or more of"):
        Storage(name="x", endpoint_url="http://x", schemes="s3 gs").clean()
    with pytest.raises(ValidationError, match="Lower-case letters"):
        Storage(name="x", endpoint_url="http://x", user_bucket_prefix="Users_").clean()


def a_sync(**state) -> OutputSync:
    where = reach("s3://user-1-a/runs/1/", FakeStorage(), 1, "a")
    return OutputSync("s3://user-1-a/runs/1/", where, SshTarget("worker-0", "10.0.0.1", 30000, "ma-user", "key"), **state)


def test_the_job_page_says_what_was_uploaded_and_names_what_was_not():
    done = a_sync(sent={"a.ckpt": (10, 1)}, found={"a.ckpt": 10}).result()
    assert (done.state, done.message) == ("uploaded", "Uploaded 1 file(s), 10 bytes, to s3://user-1-a/runs/1/.")
    partial = a_sync(sent={"a.ckpt": (10, 1)}, found={"a.ckpt": 10, "b.ckpt": 5}, failed={"b.ckpt": "HTTP 503"}).result()
    assert partial.state == "upload_partial" and partial.kept == {"a.ckpt"}
    assert partial.message.endswith("not saved: b.ckpt (HTTP 503).")
    assert a_sync().result().state == "empty"
    assert a_sync().result("timed out").state == "upload_failed"


def test_the_fetch_progress_reads_in_words():
    assert progress_words("progress files=2 bytes=2048 fetched=2048 seconds=2.0", 4, 4096) == \
        "input: 2/4 files, 2.0 KB of 4.0 KB, 1.0 KB/s"
    assert progress_words("staged files=4 bytes=4096 fetched=0 seconds=0.1", 4, 4096) == \
        "input ready: 4 files, 4.0 KB in 0.1 s; 0 bytes fetched from the store, 4.0 KB from the node's cache"
    assert progress_words("staged files=1 bytes=1024 fetched=1024 seconds=0.1", 1, 1024).startswith("input ready: 1 file, ")


@pytest.fixture
def http_store(tmp_path):
    """A plain HTTP server standing for the store's presigned URLs; it counts the GETs it answers."""
    served = tmp_path / "served"
    served.mkdir()
    gets = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def do_GET(self):
            gets.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}", gets
    server.shutdown()


def stage(tmp_path, items, reserve=0):
    return subprocess.run([sys.executable, "-c", STAGE_SCRIPT, str(tmp_path / "worker"), str(tmp_path / "cache"),
                           str(10**9), str(reserve)], input=json.dumps(items), capture_output=True, text=True)


def test_the_node_fetches_each_object_once_and_a_rerun_takes_it_from_its_cache(tmp_path, http_store):
    served, base, gets = http_store
    (served / "a.bin").write_bytes(b"a" * 5000)
    items = [{"path": "data_url_0/sub/a.bin", "url": f"{base}/a.bin", "size": 5000, "cache_key": "store|b|a.bin|etag1|5000"}]
    (tmp_path / "worker").mkdir()

    first = stage(tmp_path, items)
    assert first.returncode == 0 and "staged files=1 bytes=5000 fetched=5000" in first.stdout, first
    assert (tmp_path / "worker/inputs/data_url_0/sub/a.bin").read_bytes() == b"a" * 5000
    second = stage(tmp_path, items)
    assert "staged files=1 bytes=5000 fetched=0" in second.stdout and len(gets) == 1
    cached = tmp_path / "cache" / hashlib.sha256(b"store|b|a.bin|etag1|5000").hexdigest()
    assert cached.stat().st_mode & 0o777 == 0o644 and (tmp_path / "cache").stat().st_mode & 0o777 == 0o700


def test_an_object_listed_with_a_users_own_keys_comes_from_the_cache_only_while_the_store_answers_its_url(
        tmp_path, http_store):
    served, base, gets = http_store
    (served / "a.bin").write_bytes(b"a" * 5000)
    (tmp_path / "worker").mkdir()
    item = {"path": "data_url_0/a.bin", "url": f"{base}/a.bin", "size": 5000, "cache_key": "store|team|a.bin|e|5000"}
    assert stage(tmp_path, [item]).returncode == 0, "the first job, whose keys read it, leaves it in the cache"

    checked = stage(tmp_path, [{**item, "check_access": True}])
    assert "staged files=1 bytes=5000 fetched=0" in checked.stdout, checked
    assert len(gets) == 2, "one request to the store, answered before the cached copy was handed over"

    (served / "a.bin").unlink()  # the store no longer gives it to these keys
    refused = stage(tmp_path, [{**item, "check_access": True}])
    assert refused.returncode != 0 and "fetching data_url_0/a.bin: HTTP Error 404" in refused.stdout
    assert not (tmp_path / "worker/inputs/data_url_0/a.bin").exists()


def test_the_node_refuses_a_path_out_of_the_input_folder_an_object_of_another_size_and_a_full_disk(tmp_path, http_store):
    served, base, _ = http_store
    (served / "a.bin").write_bytes(b"a" * 10)
    (tmp_path / "worker").mkdir()
    escape = stage(tmp_path, [{"path": "../home/.ssh/authorized_keys", "url": f"{base}/a.bin", "size": 10, "cache_key": "k1"}])
    assert escape.returncode != 0 and "leaves the input folder" in escape.stdout
    assert not Path(tmp_path / "worker/home/.ssh/authorized_keys").exists()
    short = stage(tmp_path, [{"path": "data_url_0/a.bin", "url": f"{base}/a.bin", "size": 11, "cache_key": "k2"}])
    assert short.returncode != 0 and "arrived with 10 bytes, not 11" in short.stdout
    full = stage(tmp_path, [{"path": "data_url_0/a.bin", "url": f"{base}/a.bin", "size": 10, "cache_key": "k3"}],
                 reserve=10**18)
    assert full.returncode != 0 and "the input needs 10 bytes more on this node" in full.stdout


@pytest.mark.django_db
def test_the_data_api_answers_bad_urls_and_paths_with_a_clear_400_never_a_500(client, django_user_model):
    from rest_framework.test import APIClient

    user = django_user_model.objects.create_user("alice", password="pw")
    api = APIClient()
    api.force_authenticate(user)
    assert api.get("/api/v1/data").json()["buckets"] == []
    answer = api.get("/api/v1/data", {"url": "gs://bucket/data/"})
    assert answer.status_code == 400 and "gs:// is not a storage this console reads" in str(answer.json())
    answer = api.get("/api/v1/data", {"url": "s3://user-1-alice/"})
    assert answer.status_code == 400 and "No object store of this console answers to s3://" in str(answer.json())

    storage = Storage(name="away", endpoint_url="http://127.0.0.1:9")
    storage.set_keys("access", "secret")
    storage.save()
    own = f"s3://{storage.user_bucket(user.pk, 'alice')}/"
    assert api.get("/api/v1/data").json()["buckets"] == [{"storage": "away", "url": own}]
    answer = api.get("/api/v1/data", {"url": own})
    assert answer.status_code == 400 and "The object store did not answer" in str(answer.json())
    answer = api.post("/api/v1/data/upload-links", {"url": own, "paths": ["../x", "a/\x1b[2J"]},
                      format="json")
    assert answer.status_code == 400 and "cannot be an object's key" in str(answer.json())
    answer = api.get("/api/v1/data/download-link", {"url": "s3://user-9-bob/secret.bin"})
    assert answer.status_code == 400 and "is not yours" in str(answer.json())


@pytest.mark.django_db
def test_the_data_browser_offers_the_stores_a_job_of_the_chosen_pool_may_use(django_user_model):
    from rest_framework.test import APIClient

    from jobs.models import ResourcePool

    user = django_user_model.objects.create_user("alice", password="pw")
    api = APIClient()
    api.force_authenticate(user)
    pool, other = ResourcePool.objects.create(name="gpu-a"), ResourcePool.objects.create(name="gpu-b")
    for name, pools in (("everywhere", []), ("for-a", [pool]), ("for-b", [other])):
        storage = Storage(name=name, endpoint_url="http://127.0.0.1:9", schemes="obs" if name == "for-b" else "s3")
        storage.set_keys("access", "secret")
        storage.save()
        storage.pools.set(pools)

    def offered(**query) -> list[str]:
        return [bucket["storage"] for bucket in api.get("/api/v1/data", query).json()["buckets"]]

    assert offered() == ["everywhere", "for-a", "for-b"], "no pool chosen: any store, as the form takes"
    assert offered(pool=pool.pk) == ["everywhere", "for-a"]
    assert offered(pool=other.pk) == ["everywhere", "for-b"]
    refused = api.get("/api/v1/data", {"pool": pool.pk, "url": "obs://user-1-alice/"})
    assert refused.status_code == 400 and "No object store of this console answers to obs://" in str(refused.json())
    for typed in ("gpu-a", "²", "1" * 20):
        answer = api.get("/api/v1/data", {"pool": typed})
        assert (answer.status_code, answer.json()) == (400, {"pool": ["Give the pool's number."]}), typed


@pytest.mark.parametrize(("path", "acceptable"), [
    ("/mnt/datasets", True), ("/lustre/imagenet", True), ("/", False), ("mnt/datasets", False), ("/mnt", False),
    ("/mnt/../etc", False), ("/etc/ssl", False), ("/home", False), ("/home/alice", False), ("/srv/data", False),
    ("/var/run/user/1000", False), ("/var/lib/training-console/jobs", False), ("/var", False), ("/mnt/data/", False),
    ("/mnt/a:b", False), ("/mnt/a b", False), ("/mnt/a,ro", False), ("/mnt/tab\there", False),
])
def test_a_shared_file_system_is_an_absolute_folder_outside_the_systems_own(path, acceptable):
    from jobs.models import shared_path_is_acceptable

    assert shared_path_is_acceptable(path) is acceptable


def test_a_shared_file_system_is_mounted_read_only_at_its_own_path():
    plan = plan_of((("data_url", "/mnt/datasets/mnist"),))
    plan = replace(plan, read_only_mounts=("/mnt/datasets",))
    assert "/mnt/datasets:/mnt/datasets:ro,nosuid,nodev" in run_argv(plan, plan.workers[0])
    assert "--data_url=/mnt/datasets/mnist" in plan.command and not plan.stages_inputs


def test_two_nodes_sharing_a_cache_fetch_the_same_objects_at_once_and_both_get_every_one(tmp_path, http_store):
    served, base, _ = http_store
    items = []
    for number in range(30):
        (served / f"o{number}").write_bytes(bytes([number]) * 50_000)
        items.append({"path": f"data_url_0/o{number}", "url": f"{base}/o{number}", "size": 50_000,
                      "cache_key": f"store|b|o{number}|e|50000"})
    for attempt in range(4):
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)
        starts = []
        for node in ("a", "b"):
            (tmp_path / node).mkdir(exist_ok=True)
            starts.append(subprocess.Popen(
                [sys.executable, "-c", STAGE_SCRIPT, str(tmp_path / node), str(tmp_path / "cache"), str(10**9), "0"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        answers = [process.communicate(json.dumps(items), timeout=60) for process in starts]
        assert all(process.returncode == 0 for process in starts), (attempt, answers)
        for node in ("a", "b"):
            assert all((tmp_path / node / "inputs" / "data_url_0" / f"o{number}").read_bytes() == bytes([number]) * 50_000
                       for number in range(30))
        assert not list((tmp_path / "cache").glob("*.part"))


@pytest.mark.django_db
def test_the_forms_bring_back_box_reaches_the_validator_and_is_refused_without_an_object_store_train_url():
    from django.http import QueryDict

    from jobs.submission.forms import TrainingJobForm, page_data

    assert page_data(QueryDict("predownload=on&train_url=/cache/output"))["predownload"] == "on"
    form = TrainingJobForm(data={"predownload": "on", "train_url": "/cache/output"})
    assert not form.is_valid()
    assert form.errors["predownload"] == ["Bringing the output back needs an s3:// or obs:// train_url."]


def test_a_listing_from_the_jobs_container_is_read_as_untrusted():
    from jobs.runtime.data_out import well_formed

    assert well_formed(["checkpoints/a.pt", 10, 1_700_000_000_000_000_000])
    for forged in (["a", -5, 1], ["a", float("inf"), 1], ["a", True, 1], ["a", "10", 1], ["a", 1], "a", ["", 1, 1],
                   [5, 1, 1], ["a" * 5000, 1, 1]):
        assert not well_formed(forged), forged


def test_an_uploads_answer_counts_only_for_the_files_it_was_asked_to_upload():
    sync = a_sync()
    asyncio.run(sync._take_results('{"path": "a.ckpt", "size": 3}\n{"path": "../../user-2-bob/secret", "size": 1}\n'
                                   'not json\n', {"a.ckpt": (3, 7)}, {}))
    assert sync.sent == {"a.ckpt": (3, 7)}


def test_a_file_whose_name_no_key_can_hold_is_named_as_not_saved_and_the_others_are_uploaded():
    from jobs.object_store.urls import safe_key_part

    assert not safe_key_part("caf\udce9.txt") and not safe_key_part("x" * 1000) and not safe_key_part("a\u0085b")
    result = a_sync(sent={"good.ckpt": (5, 1)}, found={"good.ckpt": 5},
                    failed={"caf\\udce9.txt": "its name cannot be an object's key"}).result()
    assert result.state == "upload_partial" and result.kept == {"good.ckpt"}
    assert "not saved: caf\\udce9.txt" in result.message
