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
from tests.unit.test_shell_terminal import owners_terminal  # noqa: F401 - the fixture, found by name

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("quiet_redis")]

PERSONAS = ["owner", "teammate", "stranger", "staff", "anonymous"]

API_READS = ["", "/log", "/log/lines", "/log/download", "/log/first-error", "/log/matches", "/nccl", "/events", "/resources",
             "/outcome", "/metrics", "/checkpoints", "/outputs", "/outputs.tar.gz", "/outputs/model.txt", "/start-forecast"]
PAGE_READS = ["", "/live", "/log.txt", "/rebuild"]
# Where the console's own account pages and lists are refused to a visitor (login first).
VISITOR_REFUSED_API = ["/api/v1/training-jobs", "/api/v1/code-dirs", "/api/v1/specs", "/api/v1/engines", "/api/v1/data",
                      "/api/v1/data/upload-links", "/api/v1/data/download-link", "/api/v1/training-jobs/compare?ids=1,2"]
VISITOR_REFUSED_PAGES = ["/", "/jobs/new", "/jobs/bulk", "/jobs/preview", "/jobs/name-taken", "/capacity", "/tokens",
                         "/webhook", "/webhook/rotate", "/jobs/compare?ids=1,2", "/store-keys", "/store-keys/1",
                         "/store-keys/1/remove"]

# Every URL the console serves, by name, and the test of this module that covers it: a route added without
# a place here fails test_every_route_of_the_console_is_in_the_matrix.
ROUTE_COVERAGE = {
    **{name: "job API read" for name in (
        "api-job", "api-job-log", "api-job-log-lines", "api-job-log-download", "api-job-log-first-error",
        "api-job-log-matches",
        "api-job-nccl", "api-job-events", "api-job-resources", "api-job-outcome", "api-job-metrics", "api-job-checkpoints",
        "api-job-outputs", "api-job-outputs-archive", "api-job-output-file", "api-job-start-forecast")},
    "api-job-log-events": "job live stream",
    **{name: "job page" for name in ("job-detail", "job-live", "job-log-download", "job-rebuild")},
    **{name: "job action" for name in ("job-stop", "job-delete", "api-job-stop")},
    **{name: "job terminal" for name in ("api-job-shells", "api-job-shell-input", "api-job-shell-output")},
    **{name: "job evidence and hold" for name in ("job-evidence", "api-job-evidence", "job-release-hold",
                                                  "api-job-release-hold")},
    **{name: "visitor refused" for name in (
        "api-jobs", "api-code-dirs", "api-specs", "api-engines", "job-list", "job-create", "job-bulk",
        "job-preview", "job-name-taken", "capacity", "token-list", "store-keys", "webhook", "webhook-action")},
    # Signed in, each user reaches their own bucket, and others only with keys of their own to the store
    # (tests/unit/test_object_storage.py, tests/unit/test_store_keys.py, and tests/integration/test_object_storage.py
    # against a real store).
    **{name: "visitor refused" for name in ("api-data", "api-data-upload-links", "api-data-download-link")},
    **{name: "comparison of jobs" for name in ("job-compare", "api-jobs-compare")},
    "api-code-dir": "private code directory",
    "token-revoke": "another's token",
    # Each user's own keys to a store: the routes name the store, never a user (tests/unit/test_store_keys.py).
    **{name: "another's object-store keys" for name in ("store-keys-set", "store-keys-remove")},
    # Public on purpose: the schema and its docs describe the API and hold no one's data; signing in and
    # out and the language switch are for everyone; the admin has its own staff login and permissions
    # (tests/security/test_admin_node_keys.py, tests/unit/test_admin_force_release.py).
    **{name: "public" for name in ("api-schema", "api-docs", "login", "logout", "set_language", "admin", "favicon")},
}


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


@pytest.mark.parametrize("persona", PERSONAS)
def test_only_the_owner_opens_types_into_or_reads_a_jobs_terminal(client, owners_terminal, people,  # noqa: F811
                                                                   persona):
    user, job = people[persona], owners_terminal["job"]
    headers = {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(user, 'matrix')[1]}"} if user else {}
    base = f"/api/v1/training-jobs/{job.pk}/shells"
    opened = client.post(base, {"worker": 0}, content_type="application/json", **headers)
    typed = client.post(f"{base}/s1/input", {"text": "ls\r"}, content_type="application/json", **headers)
    read = api_get(user, f"{base}/s1/output")
    expected = {"owner": (201, 204, 200), "anonymous": (401, 401, 401)}.get(persona, (404, 404, 404))
    assert (opened.status_code, typed.status_code, read) == expected
    assert owners_terminal["typed"] == (["ls\r"] if persona == "owner" else [])
    assert owners_terminal["queued"] == (["s1"] if persona == "owner" else [])


@pytest.mark.parametrize("persona", PERSONAS)
def test_only_the_owner_downloads_a_jobs_evidence_or_releases_its_hold(client, make_job, owner, people, persona):
    from datetime import timedelta

    from django.utils import timezone

    from jobs.models import EvidenceBundle

    held_until = timezone.now() + timedelta(minutes=30)
    job = make_job(owner=owner, status=JobStatus.FAILED, debug_hold_minutes=30, held_until=held_until)
    bundle = EvidenceBundle.objects.create(job=job, attempt=1, reason="failure", content={"command": "python a.py"})
    user = people[persona]
    if user:
        client.force_login(user)
    page = client.get(f"/jobs/{job.pk}/evidence/{bundle.pk}.json")
    api = api_get(user, f"/api/v1/training-jobs/{job.pk}/evidence/{bundle.pk}")
    headers = {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(user, 'matrix')[1]}"} if user else {}
    released = client.post(f"/api/v1/training-jobs/{job.pk}/release-hold", **headers)
    expected = {"owner": 200, "anonymous": 401}.get(persona, 404)
    assert (page.status_code, api) == (302 if persona == "anonymous" else expected, expected)
    assert released.status_code == {"owner": 202, "anonymous": 401}.get(persona, 404)
    still_held = TrainingJob.objects.get(pk=job.pk).is_held_for_debugging
    assert still_held == (persona != "owner")
    if persona != "owner":
        assert client.post(f"/jobs/{job.pk}/release-hold").status_code in (302, 404)
        assert TrainingJob.objects.get(pk=job.pk).is_held_for_debugging


@pytest.mark.parametrize("persona", PERSONAS)
def test_only_the_owner_compares_a_job_on_the_page_or_in_the_api(client, finished_job, make_job, owner, people, persona):
    other = make_job(owner=owner, name="owners-other", status=JobStatus.COMPLETED)
    query = f"?ids={finished_job.pk},{other.pk}"
    if people[persona]:
        client.force_login(people[persona])
    page = client.get(f"/jobs/compare{query}")
    expected = {"owner": 200, "anonymous": 401}.get(persona, 404)
    assert api_get(people[persona], f"/api/v1/training-jobs/compare{query}") == expected
    assert page.status_code == (302 if persona == "anonymous" else expected)
    assert ("owners-job" in page.content.decode()) == (persona == "owner")


def test_a_visitor_is_refused_the_lists_and_the_submission(client):
    for path in VISITOR_REFUSED_API:
        assert client.get(path).status_code == 401, path
    assert client.post("/api/v1/training-jobs", {}, content_type="application/json").status_code == 401
    for path in VISITOR_REFUSED_PAGES:
        response = client.get(path) if path != "/webhook/rotate" else client.post(path)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"], path


def console_routes(patterns=None, prefix: str = "") -> dict[str, str]:
    """Every named URL of the console, with its route; the admin's as one ("admin")."""
    from django.urls import URLResolver, get_resolver

    found: dict[str, str] = {}
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            if pattern.namespace == "admin":
                found["admin"] = route
            else:
                found.update(console_routes(pattern.url_patterns, route))
        else:
            found[pattern.name or route] = route
    return found


def test_every_route_of_the_console_is_in_the_matrix():
    routes = console_routes()
    assert set(routes) - set(ROUTE_COVERAGE) == set(), "routes nobody checks: add them to ROUTE_COVERAGE and test them"
    assert set(ROUTE_COVERAGE) - set(routes) == set(), "the matrix names routes that no longer exist"
    job_routes = {name for name, route in routes.items() if "<id:pk>" in route and route.startswith(("jobs/", "api/v1/training-jobs"))}
    covered_job_routes = {name for name, how in ROUTE_COVERAGE.items() if how.startswith("job ")}
    assert job_routes == covered_job_routes, "a job's route must be in one of the job tests"
    api_reads = {f"api/v1/training-jobs/<id:pk>{read}".replace("model.txt", "<path:path>") for read in API_READS}
    assert {routes[name] for name, how in ROUTE_COVERAGE.items() if how == "job API read"} == api_reads
    assert {routes[name] for name, how in ROUTE_COVERAGE.items() if how == "job page"} == {
        f"jobs/<id:pk>{read}" for read in PAGE_READS}


@pytest.mark.parametrize("persona", ["teammate", "stranger", "staff", "anonymous"])
def test_nobody_but_its_owner_reads_or_changes_a_private_code_directory(people, owner, persona):
    from rest_framework.test import APIClient

    from jobs.models import CodeDirectory

    private = CodeDirectory.objects.create(name="owners-code", path="/nowhere", owner=owner)
    client = APIClient()
    if people[persona]:
        client.force_authenticate(people[persona])
    expected = 401 if persona == "anonymous" else 404
    assert client.get(f"/api/v1/code-dirs/{private.pk}").status_code == expected
    assert client.patch(f"/api/v1/code-dirs/{private.pk}", {"sharing": "everyone"}, format="json").status_code == expected
    assert CodeDirectory.objects.get(pk=private.pk).sharing == CodeDirectory.Sharing.PRIVATE


@pytest.mark.parametrize("persona", ["teammate", "stranger", "staff"])
def test_nobody_revokes_anothers_api_token(client, people, owner, persona):
    token = ApiToken.issue(owner, "owners")[0]
    client.force_login(people[persona])
    assert client.post(f"/tokens/{token.pk}/revoke").status_code == 404
    assert ApiToken.objects.filter(pk=token.pk).exists()


@pytest.mark.parametrize("persona", ["teammate", "stranger", "staff"])
def test_nobody_sees_replaces_or_removes_anothers_object_store_keys(client, people, owner, persona):
    from jobs.models import Storage, UserStoreKeys

    storage = Storage(name="team", endpoint_url="http://127.0.0.1:9", users_may_bring_keys=True)
    storage.set_keys("store-access", "store-secret")
    storage.save()
    kept = UserStoreKeys.keep(owner, storage, "AKOWNERS0001", "owners-secret-1")
    client.force_login(people[persona])

    page = client.get("/store-keys").content.decode()
    removed = client.post(f"/store-keys/{storage.pk}/remove")
    client.post(f"/store-keys/{storage.pk}", {f"store-{storage.pk}-access_key": "AKTHEIRS0001",
                                             f"store-{storage.pk}-secret_key": "theirs-secret-1",
                                             f"store-{storage.pk}-bucket": "team-datasets"})

    assert "set on" not in page and "AKOWNERS" not in page and removed.status_code == 404
    assert UserStoreKeys.objects.get(pk=kept.pk).access().access_key == "AKOWNERS0001"


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
