"""Schemathesis against the API's own schema: a few generated requests per operation, sent through the WSGI
application as each person (owner, teammate, stranger, staff, a visitor), answer with no server error and
nothing the schema does not say (status code, content type, body, headers).

The console holds one finished job of the owner's, with a log, a metric and a kept output file, and no node,
so no generated submission can start a job (a live job's event stream would not end)."""

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from jobs.models import ApiToken, JobOutputFile, JobStatus, MetricPoint, TrainingJob
from tests.fixtures import person
from tests.unit.log_helpers import quiet_redis, rank_line, store, system_line  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet_redis", "test_connection_kept")]
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]
PERSONAS = ("owner", "teammate", "stranger", "staff", None)


@pytest.fixture
def test_connection_kept():
    """The WSGI handler closes the database connection after each request, as a server should; here that
    connection holds the test's transaction (Django's test client keeps it the same way)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def console_state(make_job, settings, tmp_path):
    settings.CONSOLE_VAR_DIR = tmp_path
    settings.OUTPUTS_ROOT = tmp_path / "outputs"
    job = make_job(name="finished", parameters=[{"name": "train_url", "value": "/cache/out"}])
    store(job, [system_line("Preparing 2 worker(s)"), rank_line(0, "step 1 loss=0.5"), rank_line(1, "Traceback (most recent")])
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.FAILED, exit_code=1, final_metrics={"loss": 0.5})
    MetricPoint.objects.create(job=job, name="loss", rank=0, step=1, value=0.5, at=job.created_at, seq=2)
    JobOutputFile.objects.create(job=job, path="model.bin", size=3, kept=False)
    tokens = {name: ApiToken.issue(person(name, is_staff=name == "staff"), "schemathesis")[1]
              for name in PERSONAS if name}
    return {"job": job, "tokens": tokens}


# Loaded as the module is collected: the schema is generated without the database.
schema = schemathesis.openapi.from_wsgi("/api/v1/schema", get_wsgi_application())


@schema.parametrize()
@settings(max_examples=4, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
def test_every_operation_answers_within_its_schema(case, console_state):
    if "id" in (case.path_parameters or {}):
        # The one job there is: a random id is only ever a 404, which the bad-input tests cover.
        case.path_parameters["id"] = console_state["job"].pk
    for name in PERSONAS:
        headers = {"Authorization": f"Token {console_state['tokens'][name]}"} if name else {}
        case.call_and_validate(headers=headers, checks=CHECKS)
