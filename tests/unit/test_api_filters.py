"""The job list: paginated, filtered by state, owner, spec, pool, engine, creation time and name, ordered,
and never holding a job its reader may not see."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from jobs.models import JobStatus, ResourcePool, TrainingJob
from tests.fixtures import api_client, cpu_spec

pytestmark = pytest.mark.django_db
JOBS = "/api/v1/training-jobs"


def names(user, **query) -> list[str]:
    answer = api_client(user).get(JOBS, query)
    assert answer.status_code == 200, answer.content
    return [job["name"] for job in answer.json()["results"]]


def may_view_all(user):
    user.user_permissions.add(Permission.objects.get(codename="view_trainingjob"))
    return type(user).objects.get(pk=user.pk)


@pytest.fixture
def jobs(make_job, owner, teammate):
    now = timezone.now()
    pool = ResourcePool.objects.create(name="team")
    made = [
        make_job(owner=owner, name="alpha-run", status=JobStatus.RUNNING, created_at=now - timedelta(days=3)),
        make_job(owner=owner, name="beta-run", status=JobStatus.FAILED, created_at=now - timedelta(days=2),
                 spec=cpu_spec("ib"), pool=pool),
        make_job(owner=owner, name="gamma", status=JobStatus.COMPLETED, created_at=now - timedelta(days=1)),
        make_job(owner=teammate, name="teammates", status=JobStatus.RUNNING, created_at=now),
    ]
    return {job.name: job for job in made}


def test_the_list_is_newest_first_and_holds_only_the_readers_own_jobs(jobs, owner, teammate, stranger):
    assert names(owner) == ["gamma", "beta-run", "alpha-run"]
    assert names(teammate) == ["teammates"]
    assert names(stranger) == []


def test_filters_narrow_the_list(jobs, owner):
    assert names(owner, status="Running") == ["alpha-run"]
    assert names(owner, status=["Running", "Failed"]) == ["beta-run", "alpha-run"]
    assert names(owner, spec="cpu-ib") == ["beta-run"]
    assert names(owner, pool="team") == ["beta-run"]
    assert names(owner, engine="MPI") == ["gamma", "beta-run", "alpha-run"]
    assert names(owner, name="RUN") == ["beta-run", "alpha-run"]
    assert names(owner, owner="owner") == ["gamma", "beta-run", "alpha-run"]
    middle = jobs["beta-run"].created_at
    assert names(owner, created_after=middle.isoformat()) == ["gamma", "beta-run"]
    assert names(owner, created_before=middle.isoformat()) == ["alpha-run"]
    assert names(owner, created_after=(middle - timedelta(hours=1)).isoformat(),
                 created_before=(middle + timedelta(hours=1)).isoformat()) == ["beta-run"]


def test_filtering_by_another_owner_shows_nothing_to_whoever_may_not_see_their_jobs(jobs, owner, staff):
    assert names(owner, owner="teammate") == []
    assert names(staff, owner="owner") == []
    assert names(may_view_all(staff), owner="teammate") == ["teammates"]
    assert names(may_view_all(staff), status="Running") == ["teammates", "alpha-run"]


def test_ordering_by_any_listed_field_either_way(jobs, owner):
    assert names(owner, ordering="created_at") == ["alpha-run", "beta-run", "gamma"]
    assert names(owner, ordering="name") == ["alpha-run", "beta-run", "gamma"]
    assert names(owner, ordering="-name") == ["gamma", "beta-run", "alpha-run"]
    assert names(owner, ordering="status") == ["gamma", "beta-run", "alpha-run"]
    # A field that cannot be ordered by is ignored: the default order stands.
    assert names(owner, ordering="owner__password") == ["gamma", "beta-run", "alpha-run"]


def test_jobs_created_together_keep_one_order_across_pages(make_job, owner):
    at = timezone.now()
    for index in range(7):
        make_job(owner=owner, name=f"same-{index}", created_at=at)
    pages = [names(owner, limit=3, offset=offset) for offset in (0, 3, 6)]
    assert sum(pages, []) == [f"same-{index}" for index in reversed(range(7))]


def test_the_list_pages_with_limit_and_offset_and_no_row_cap(make_job, owner):
    seed = make_job(owner=owner, name="seed")
    TrainingJob.objects.bulk_create([
        TrainingJob(name=f"job-{index}", owner=owner, engine_version=seed.engine_version, code_dir=seed.code_dir,
                    spec=seed.spec, boot_file="train.py", bind_args="", x_args="", mca_args="", tune_prefixes="MA_")
        for index in range(600)
    ])
    client = api_client(owner)
    first = client.get(JOBS).json()
    assert first["count"] == 601 and len(first["results"]) == 50 and first["previous"] is None
    assert "offset=50" in first["next"]
    last = client.get(JOBS, {"limit": 1000}).json()
    assert len(last["results"]) == 601 and last["next"] is None


@pytest.mark.parametrize("query, field", [
    ({"status": "Sleeping"}, "status"),
    ({"created_after": "yesterday"}, "created_after"),
    ({"created_before": "2026-13-01"}, "created_before"),
    ({"offset": str(10**10)}, "offset"),
])
def test_a_bad_filter_is_a_400_naming_it(jobs, owner, query, field):
    answer = api_client(owner).get(JOBS, query)
    assert answer.status_code == 400 and field in answer.json(), answer.content
