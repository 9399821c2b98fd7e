"""One name for an engine everywhere: the engine list, a job's detail and a submission say `engine` and
`engine_version` alike, and a job's detail posted back (its read-only fields left out) submits an equal job."""

import pytest

from jobs.models import Engine, EngineVersion, ResourcePool, ResourceSpec, TrainingJob
from tests.fixtures import add_nodes, job_body

pytestmark = pytest.mark.django_db

# What a submission sets; everything else of a job is the console's.
SUBMITTED = ("name", "description", "engine_version_id", "code_dir_id", "boot_file", "parameters", "env", "spec_id",
             "pool_id", "node_count", "extra_args", "auto_stop_hours", "metric_definitions", "watchdog_seconds")


@pytest.fixture
def submit(api, catalogue, django_capture_on_commit_callbacks):
    def post(body: dict):
        with django_capture_on_commit_callbacks(execute=False):
            return api.post("/api/v1/training-jobs", body, format="json")
    return post


def read_only_fields(api) -> set[str]:
    schema = api.get("/api/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    return {name for name, field in schema["components"]["schemas"]["TrainingJob"]["properties"].items()
            if field.get("readOnly")}


def submitted(job: TrainingJob) -> dict:
    return {field: getattr(job, field) for field in SUBMITTED}


def test_what_the_engine_list_names_is_what_a_submission_takes(api, submit):
    listed = api.get("/api/v1/engines").json()["results"]
    assert [(item["engine"], item["engine_version"]) for item in listed] == [("MPI", "local")]
    response = submit(job_body(engine=listed[0]["engine"], engine_version=listed[0]["engine_version"]))
    assert response.status_code == 201, response.content
    assert (response.json()["engine"], response.json()["engine_version"]) == ("MPI", "local")


@pytest.mark.parametrize("given", [{"engine": "MPI"}, {"engine": "local"}, {"engine": "MPI local"}, {"engine": "id"}])
def test_what_the_form_accepts_for_an_engine_still_names_it(submit, given):
    if given["engine"] == "id":
        given = {"engine": EngineVersion.objects.get().pk}
    response = submit(job_body(**given))
    assert response.status_code == 201, response.content
    assert response.json()["engine_version"] == "local"


def test_an_engine_version_that_is_not_the_engines_is_refused_naming_the_field(submit):
    other = EngineVersion.objects.create(engine=Engine.objects.create(name="Horovod"), version="h1")
    for body in (job_body(engine="MPI", engine_version="nope"), job_body(engine="MPI", engine_version=other.version),
                 job_body(engine=["MPI"], engine_version="local")):
        response = submit(body)
        assert response.status_code == 400 and "engine_version" in response.json(), response.content
    assert not TrainingJob.objects.exists()


def test_a_jobs_detail_posted_back_without_its_read_only_fields_submits_an_equal_job(api, submit):
    pool = ResourcePool.objects.create(name="team")
    spec = ResourceSpec.objects.get(name="cpu")
    for node in add_nodes(spec, 2, prefix="pooled"):
        node.pool = pool
        node.save()
    first = submit(job_body(
        description="everything given", engine="MPI", engine_version="local", data_url="/cache/data",
        train_url="/cache/out", parameters=[{"name": "lr", "value": "0.1"}, {"name": "steps", "value": 5}],
        env={"MY_FLAG": "x y", "OTHER": "1"}, pool="team", extra_args="--display-map", auto_stop_hours=3,
        metrics=[{"name": "loss", "regex": r"loss=(?P<value>[0-9.]+)"}], watchdog_seconds=120))
    assert first.status_code == 201, first.content
    detail = api.get(f"/api/v1/training-jobs/{first.json()['id']}").json()
    assert detail == first.json()
    assert (detail["data_url"], detail["train_url"]) == ("/cache/data", "/cache/out")
    assert detail["parameters"] == [{"name": "lr", "value": "0.1"}, {"name": "steps", "value": "5"}]

    body = {name: value for name, value in detail.items() if name not in read_only_fields(api)}
    assert "id" not in body and "status" not in body and "engine_version" in body
    again = submit(body)
    assert again.status_code == 201, again.content
    original, copy = TrainingJob.objects.get(pk=detail["id"]), TrainingJob.objects.get(pk=again.json()["id"])
    assert copy.pk != original.pk
    assert submitted(copy) == submitted(original)
    assert copy.parameters[:2] == [{"name": "data_url", "value": "/cache/data"}, {"name": "train_url", "value": "/cache/out"}]


def test_a_minimal_jobs_detail_posted_back_submits_an_equal_job_too(api, submit):
    first = submit(job_body())
    assert first.status_code == 201, first.content
    body = {name: value for name, value in first.json().items() if name not in read_only_fields(api)}
    assert body["pool"] is None and body["auto_stop_hours"] is None
    again = submit(body)
    assert again.status_code == 201, again.content
    jobs = TrainingJob.objects.order_by("pk")
    assert submitted(jobs[0]) == submitted(jobs[1])
