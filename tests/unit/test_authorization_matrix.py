"""Who reaches what: every page, API route and live stream of one job, for the owner, a teammate, a stranger,
staff without permissions and an anonymous visitor. Only the owner gets in; the others learn nothing,
not even that the job exists (404), and a visitor is sent to log in (pages) or refused (API, 401)."""

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from jobs.logs.store import LogRecord, store_lines
from jobs.models import ApiToken, JobOutputFile, JobStatus, LogStream, TrainingJob
from jobs.results.outputs import outputs_root
from tests.unit.log_helpers import quiet_redis  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("quiet_redis")]

PERSONAS = ["owner", "teammate", "stranger", "staff", "anonymous"]

API_READS = ["", "/log", "/log/lines", "/log/download", "/log/first-error", "/nccl", "/outcome", "/metrics",
             "/outputs", "/outputs.tar.gz", "/outputs/model.txt"]
PAGE_READS = ["", "/rebuild"]


@pytest.fixture
def finished_job(make_job, owner, tmp_path, settings):
    settings.VAR_DIR = tmp_path
    job = make_job(owner=owner, name="owners-job", status=JobStatus.COMPLETED, env={"CRED_X": "secret"})
    store_lines(job.pk, [LogRecord(text="hello", stream=LogStream.STDOUT, rank=0, worker_index=0)])
    root = outputs_root(job.pk)
    root.mkdir(parents=True)
    (root / "model.txt").write_text("weights")
    JobOutputFile.objects.create(job=job, path="model.txt", size=7, kept=True)
    return job


@pytest.fixture
def people(owner, teammate, stranger, staff):
    return {"owner": owner, "teammate": teammate, "stranger": stranger, "staff": staff, "anonymous": None}


def api_get(user, path: str) -> int:
    headers = {"Authorization": f"Token {ApiToken.issue(user, 'matrix')[1]}"} if user else {}

    async def get() -> int:
        response = await AsyncClient().get(path, headers=headers)
        if response.streaming and response.is_async:
            async for _chunk in response.streaming_content:
                pass
        return response.status_code

    return async_to_sync(get)()


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("route", API_READS + ["/log/events"])
def test_only_the_owner_reads_a_jobs_api_routes_and_live_stream(finished_job, people, persona, route):
    status = api_get(people[persona], f"/api/v1/training-jobs/{finished_job.pk}{route}")
    expected = {"owner": 200, "anonymous": 401}.get(persona, 404)
    assert status == expected, f"{persona} on {route or '/'}"


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("route", PAGE_READS)
def test_only_the_owner_opens_a_jobs_pages(client, finished_job, people, persona, route):
    if people[persona]:
        client.force_login(people[persona])
    response = client.get(f"/jobs/{finished_job.pk}{route}")
    if persona == "owner":
        assert response.status_code == 200
    elif persona == "anonymous":
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    else:
        assert response.status_code == 404


@pytest.mark.parametrize("persona", ["teammate", "stranger", "staff"])
@pytest.mark.parametrize("action", ["stop", "delete"])
def test_nobody_but_the_owner_stops_or_deletes_a_job_from_the_pages_or_the_api(client, make_job, owner, people,
                                                                               persona, action):
    job = make_job(owner=owner, status=JobStatus.PENDING if action == "stop" else JobStatus.COMPLETED)
    client.force_login(people[persona])
    assert client.post(f"/jobs/{job.pk}/{action}").status_code == 404
    if action == "stop":
        token = ApiToken.issue(people[persona], "matrix")[1]
        assert client.post(f"/api/v1/training-jobs/{job.pk}/stop", HTTP_AUTHORIZATION=f"Token {token}").status_code == 404
    assert TrainingJob.objects.get(pk=job.pk).status == job.status


def test_a_visitor_is_refused_the_lists_and_the_submission(client):
    for path in ("/api/v1/training-jobs", "/api/v1/code-dirs", "/api/v1/specs", "/api/v1/engines"):
        assert client.get(path).status_code == 401, path
    assert client.post("/api/v1/training-jobs", {}, content_type="application/json").status_code == 401
    for path in ("/", "/jobs/new", "/capacity", "/tokens"):
        assert client.get(path).status_code == 302, path


def test_the_job_list_of_each_person_holds_only_their_own_jobs(make_job, finished_job, people, teammate):
    make_job(owner=teammate, name="teammates-job")
    for persona, user in people.items():
        if user is None:
            continue
        token = ApiToken.issue(user, "matrix")[1]
        names = {job["name"] for job in _list(token)}
        expected = {"owner": {"owners-job"}, "teammate": {"teammates-job"}}.get(persona, set())
        assert names == expected, persona


def _list(token: str) -> list[dict]:
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    answer = client.get("/api/v1/training-jobs").json()
    return answer["results"] if isinstance(answer, dict) else answer
