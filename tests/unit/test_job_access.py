"""Who sees which job (jobs.submission.access): an owner their own jobs; staff others' only with the permission for it."""

import pytest
from django.contrib.auth.models import Permission

from jobs.models import JobStatus
from tests.fixtures import api_client

pytestmark = pytest.mark.django_db


def listed(user) -> set[str]:
    return {job["name"] for job in api_client(user).get("/api/v1/training-jobs").json()["results"]}


def test_the_owner_sees_their_job_while_a_teammate_and_a_stranger_see_only_their_own(make_job, owner, teammate, stranger):
    owners_job = make_job(owner=owner, name="owners")
    make_job(owner=teammate, name="teammates")

    assert listed(owner) == {"owners"}
    assert listed(teammate) == {"teammates"}
    assert listed(stranger) == set()
    assert api_client(owner).get(f"/api/v1/training-jobs/{owners_job.pk}").status_code == 200
    for other in (teammate, stranger):
        assert api_client(other).get(f"/api/v1/training-jobs/{owners_job.pk}").status_code == 404


def test_staff_without_permissions_see_only_their_own_jobs_and_not_the_back_offices_job_list(client, make_job, owner, teammate, staff):
    owners_job = make_job(owner=owner, name="owners")
    make_job(owner=teammate, name="teammates")

    assert listed(staff) == set()
    assert api_client(staff).get(f"/api/v1/training-jobs/{owners_job.pk}").status_code == 404
    client.force_login(staff)
    assert client.get("/admin/jobs/trainingjob/").status_code == 403


def test_staff_who_may_view_jobs_see_every_job_but_may_stop_another_s_only_with_the_change_permission(make_job, owner, staff):
    owners_job = make_job(owner=owner, name="owners", status=JobStatus.PENDING)
    staff.user_permissions.add(Permission.objects.get(codename="view_trainingjob"))
    staff = type(staff).objects.get(pk=staff.pk)  # permissions are cached on the user object

    assert listed(staff) == {"owners"}
    assert api_client(staff).post(f"/api/v1/training-jobs/{owners_job.pk}/stop").status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="change_trainingjob"))
    staff = type(staff).objects.get(pk=staff.pk)
    assert api_client(staff).post(f"/api/v1/training-jobs/{owners_job.pk}/stop").status_code == 200
