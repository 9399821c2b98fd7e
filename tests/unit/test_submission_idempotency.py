"""Submissions that are retried: the Idempotency-Key header makes a retry return the first job, per person;
queue order is the order submissions committed in."""

import pytest
from django.utils import timezone

from jobs.models import TrainingJob
from tests.fixtures import api_client, job_body
from tests.unit.log_helpers import quiet_redis  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("catalogue", "quiet_redis")]


def submit(client, key=None, **fields):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post("/api/v1/training-jobs", job_body(**fields), format="json", **headers)


def test_a_retry_with_the_same_key_returns_the_first_job_and_creates_nothing(api):
    first, retry = submit(api, "abc-1"), submit(api, "abc-1")
    assert (first.status_code, retry.status_code) == (201, 200)
    assert retry.json()["id"] == first.json()["id"]
    assert retry["Idempotent-Replayed"] == "true" and not first.has_header("Idempotent-Replayed")
    assert TrainingJob.objects.count() == 1


def test_without_a_key_each_submission_is_a_job(api):
    assert {submit(api).status_code, submit(api).status_code} == {201}
    assert TrainingJob.objects.count() == 2


def test_a_strangers_key_is_their_own_even_when_it_is_spelt_the_same(api, stranger):
    mine, theirs = submit(api, "same"), submit(api_client(stranger), "same")
    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert mine.json()["id"] != theirs.json()["id"]


@pytest.mark.parametrize("key", ["", "x" * 129, "has space", "tab\tinside", "ção"])
def test_a_key_that_is_not_printable_ascii_is_refused_where_it_was_given(api, key):
    if key == "":
        assert submit(api, key).status_code == 201  # an empty header is no key
        return
    try:
        response = submit(api, key)
    except UnicodeEncodeError:
        pytest.skip("the test client cannot send this header at all")
    assert response.status_code == 400
    assert response.json() == {"Idempotency-Key": ["At most 128 printable ASCII characters."]}
    assert TrainingJob.objects.count() == 0


def test_a_jobs_place_in_the_queue_is_stamped_when_its_submission_commits(api, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as after_commit:
        job_id = submit(api).json()["id"]
    committed = timezone.now()
    assert TrainingJob.objects.get(pk=job_id).created_at < committed
    for callback in after_commit:
        callback()
    assert TrainingJob.objects.get(pk=job_id).created_at >= committed
