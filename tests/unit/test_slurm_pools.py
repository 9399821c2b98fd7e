"""A Slurm pool as an administrator sets it up: what the admin asks for and refuses, that its secrets are never
shown back, the tokens the console makes from a key, and what it keeps of slurmdbd's accounting."""

import base64
import time

import jwt
import pytest
from django.test import Client

from jobs.allocation import nodes_for
from jobs.backends.slurm import account_usage, accounting_summary, credentials_for
from jobs.models import Node, ResourcePool, ResourceSpec, TrainingJob
from jobs.secret_box import seal_secret
from tests.fixtures import person

pytestmark = pytest.mark.django_db

KEY = base64.b64encode(b"k" * 32).decode()
TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJtYS11c2VyIn0.secret-signature-part"
FIELDS = {"name": "gpu-slurm", "kind": "dedicated", "backend": "slurm", "slurm_url": "http://slurm.example.org:6820",
          "slurm_partition": "gpu", "slurm_user": "svc-console", "slurm_account": "", "slurm_root_ssh": "on"}


@pytest.fixture
def admin_client():
    client = Client()
    client.force_login(person("pool-admin", is_staff=True, is_superuser=True))
    return client


def test_a_slurm_pool_saved_with_a_token_never_shows_it_back(admin_client):
    answer = admin_client.post("/admin/jobs/resourcepool/add/", {**FIELDS, "slurm_token": TOKEN})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    pool = ResourcePool.objects.get(name="gpu-slurm")
    assert pool.slurm_token == TOKEN and TOKEN not in pool.sealed_slurm_token
    page = admin_client.get(f"/admin/jobs/resourcepool/{pool.pk}/change/").content.decode()
    assert "secret-signature-part" not in page and pool.sealed_slurm_token not in page
    assert "an administrator&#x27;s choice for this pool" in page


def test_saving_the_pool_again_without_a_secret_keeps_the_saved_one(admin_client):
    admin_client.post("/admin/jobs/resourcepool/add/", {**FIELDS, "slurm_jwt_key": KEY})
    pool = ResourcePool.objects.get(name="gpu-slurm")
    answer = admin_client.post(f"/admin/jobs/resourcepool/{pool.pk}/change/", {**FIELDS, "slurm_partition": "gpu2"})
    assert answer.status_code == 302
    pool.refresh_from_db()
    assert (pool.slurm_partition, pool.slurm_jwt_key, pool.slurm_token) == ("gpu2", KEY, "")


@pytest.mark.parametrize(("change", "error"), [
    ({"slurm_url": ""}, "A Slurm pool needs slurmrestd&#x27;s address."),
    ({"slurm_partition": "", "slurm_user": ""}, "A Slurm pool needs the partition, the Slurm user."),
    ({"slurm_jwt_key": "not base64!"}, "This is not base64."),
    ({"slurm_jwt_key": base64.b64encode(b"short").decode()}, "Slurm&#x27;s are 32 bytes or more"),
])
def test_an_incomplete_slurm_pool_is_refused_saying_what_is_missing(admin_client, change, error):
    answer = admin_client.post("/admin/jobs/resourcepool/add/", {**FIELDS, "slurm_token": TOKEN, **change})
    assert answer.status_code == 200
    assert error in answer.content.decode()
    assert not ResourcePool.objects.filter(name="gpu-slurm").exists()


def test_a_slurm_pool_without_root_ssh_is_saved_and_its_page_says_the_console_logs_in_as_the_slurm_user(admin_client):
    answer = admin_client.post("/admin/jobs/resourcepool/add/", {**FIELDS, "slurm_token": TOKEN, "slurm_root_ssh": ""})
    assert answer.status_code == 302
    pool = ResourcePool.objects.get(name="gpu-slurm")
    assert not pool.slurm_root_ssh
    page = admin_client.get(f"/admin/jobs/resourcepool/{pool.pk}/change/").content.decode()
    assert "as the Slurm user svc-console, never as root" in page


def test_the_way_to_the_nodes_does_not_change_under_a_job_that_holds_a_slurm_job(admin_client, make_job):
    admin_client.post("/admin/jobs/resourcepool/add/", {**FIELDS, "slurm_token": TOKEN})
    pool = ResourcePool.objects.get(name="gpu-slurm")
    job = make_job(name="holds")
    TrainingJob.objects.filter(pk=job.pk).update(pool=pool, slurm_job_id=41)
    # Its batch job was submitted for root SSH: it would never start the containers a pool without root awaits.
    answer = admin_client.post(f"/admin/jobs/resourcepool/{pool.pk}/change/", {**FIELDS, "slurm_root_ssh": ""})
    assert answer.status_code == 200
    assert "Slurm user and root SSH can change once they have ended" in answer.content.decode()
    pool.refresh_from_db()
    assert pool.slurm_root_ssh


def test_a_slurm_pool_needs_a_token_or_a_key(admin_client):
    answer = admin_client.post("/admin/jobs/resourcepool/add/", FIELDS)
    assert "A Slurm pool needs a token or the cluster&#x27;s JWT key." in answer.content.decode()


def test_a_token_made_from_the_pools_key_names_the_slurm_user_and_expires_within_minutes():
    pool = ResourcePool(name="p", backend="slurm", slurm_user="svc-console", sealed_slurm_jwt_key=seal_secret(KEY))
    credentials = credentials_for(pool)
    claims = jwt.decode(credentials.token, base64.b64decode(KEY), algorithms=["HS256"])
    assert (credentials.user, claims["sun"]) == ("svc-console", "svc-console")
    assert time.time() < claims["exp"] <= time.time() + 600


def test_a_slurm_pools_nodes_are_never_public_capacity():
    spec = ResourceSpec.objects.create(name="cpu-s", cpu_cores=1, memory_gb=1)
    slurm = ResourcePool.objects.create(name="s", kind="public", backend="slurm")
    Node.objects.create(name="slurm-0", address="10.9.0.1", spec=spec, pool=slurm)
    Node.objects.create(name="own-0", address="10.9.0.2", spec=spec)
    assert [node.name for node in nodes_for(TrainingJob(spec=spec))] == ["own-0"]
    assert [node.name for node in nodes_for(TrainingJob(spec=spec, pool=slurm))] == ["slurm-0"]


def test_the_accounting_kept_is_what_the_job_page_shows_in_hours():
    record = {"account": "vision", "qos": "high", "state": {"current": "COMPLETED"},
              "time": {"elapsed": 1800, "total": {"seconds": 3000}},
              "tres": {"allocated": [{"type": "cpu", "count": 8}, {"type": "node", "count": 2},
                                     {"type": "gres", "name": "gpu", "count": 4}, {"type": "mem", "count": 8192}]}}
    assert accounting_summary(record) == {
        "account": "vision", "qos": "high", "state": "COMPLETED", "elapsed_seconds": 1800, "nodes": 2, "cpus": 8,
        "gpus": 4, "cpu_hours": 4.0, "gpu_hours": 2.0, "cpu_time_used_seconds": 3000}


def test_each_accounts_fair_share_is_shown_beside_its_use_of_the_cluster():
    associations = [{"account": "root", "parent_account": None, "shares_raw": 1, "user": None},
                    {"account": "research", "parent_account": "root", "shares_raw": 60, "user": None},
                    {"account": "vision", "parent_account": "root", "shares_raw": 40, "user": None},
                    {"account": "vision", "parent_account": "root", "shares_raw": 1, "user": "ma-user"}]
    jobs = [{"account": "research", "time": {"elapsed": 3600},
             "tres": {"allocated": [{"type": "cpu", "count": 4}, {"type": "gres", "name": "gpu", "count": 1}]}},
            {"account": "vision", "time": {"elapsed": 1800}, "tres": {"allocated": [{"type": "cpu", "count": 8}]}}]
    rows = {row["account"]: row for row in account_usage(associations, jobs)}
    assert set(rows) == {"root", "research", "vision"}  # a user's association is not an account
    assert (rows["research"]["norm_shares"], rows["vision"]["norm_shares"], rows["root"]["norm_shares"]) == (0.6, 0.4, 1.0)
    assert (rows["research"]["cpu_hours"], rows["research"]["gpu_hours"], rows["research"]["jobs"]) == (4.0, 1.0, 1)
    assert (rows["research"]["usage_share"], rows["vision"]["usage_share"], rows["root"]["usage_share"]) == (0.5, 0.5, 0.0)


def test_the_capacity_page_shows_a_slurm_pools_nodes_and_accounts_as_slurm_last_said():
    ResourcePool.objects.create(
        name="gpu-slurm", backend="slurm", slurm_partition="gpu", slurm_status="reachable: Slurm 22.05.8, REST API v0.0.38",
        slurm_nodes=[{"name": "gpu-7", "state": "drain", "reason": "bad DIMM", "cpus": 64, "alloc_cpus": 0,
                      "memory_mb": 512000, "gres": "gpu:8"}],
        slurm_accounts=[{"account": "vision", "parent": "root", "shares": 40, "norm_shares": 0.4, "jobs": 3,
                         "cpu_hours": 12.5, "gpu_hours": 3.0, "usage_share": 0.7}])
    client = Client()
    client.force_login(person("viewer"))
    page = client.get("/capacity").content.decode()
    assert "Slurm partition gpu" in page and "reachable: Slurm 22.05.8" in page
    assert "<th scope=\"row\">gpu-7</th><td>drain</td><td>bad DIMM</td><td>0 / 64</td>" in page
    assert "<th scope=\"row\">vision</th><td>root</td><td>40</td><td>0.4</td><td>3</td><td>12.5</td><td>3.0</td><td>0.7</td>" in page


def test_a_pool_whose_jobs_hold_slurm_jobs_keeps_its_partition_until_they_end(admin_client, make_job, owner):
    admin_client.post("/admin/jobs/resourcepool/add/", {**FIELDS, "slurm_token": TOKEN})
    pool = ResourcePool.objects.get(name="gpu-slurm")
    job = make_job(owner=owner)
    TrainingJob.objects.filter(pk=job.pk).update(pool=pool, slurm_job_id=12)
    answer = admin_client.post(f"/admin/jobs/resourcepool/{pool.pk}/change/", {**FIELDS, "slurm_partition": "other"})
    assert "can change once they have ended" in answer.content.decode()
    TrainingJob.objects.filter(pk=job.pk).update(slurm_released=True)
    answer = admin_client.post(f"/admin/jobs/resourcepool/{pool.pk}/change/", {**FIELDS, "slurm_partition": "other"})
    assert answer.status_code == 302


@pytest.mark.parametrize(("user", "error"), [("root", "does not submit as root"), ("Bad User", "Unix account name")])
def test_the_slurm_user_is_a_plain_account_and_never_root(admin_client, user, error):
    answer = admin_client.post("/admin/jobs/resourcepool/add/", {**FIELDS, "slurm_token": TOKEN, "slurm_user": user})
    assert error in answer.content.decode()
