"""Secrets are shown to their owner only: staff who may look at a job see its secret-looking values masked,
in the API, in the back office and in the console's own log."""

import logging

import pytest
from django.contrib.auth.models import Permission

from console.log_context import MaskSecretsFilter
from jobs.launch.masking import MASK
from tests.fixtures import api_client

pytestmark = pytest.mark.django_db

SECRET = "hunter2-very-private"


@pytest.fixture
def secret_job(make_job, owner):
    return make_job(owner=owner, env={"CRED_TOKEN": SECRET, "NCCL_DEBUG": "INFO"},
                    parameters=[{"name": "api_key", "value": SECRET}, {"name": "lr", "value": "0.1"}],
                    command=f"mpirun -np 4 python train.py --api_key={SECRET} --lr=0.1",
                    command_template=f"mpirun -np ${{OPENMPI_NP}} python train.py --api_key={SECRET} --lr=0.1")


def allowed_to_view(user):
    user.user_permissions.add(Permission.objects.get(codename="view_trainingjob"))
    return type(user).objects.get(pk=user.pk)


def test_the_owner_sees_their_own_secret_values_in_the_api(secret_job, owner):
    shown = api_client(owner).get(f"/api/v1/training-jobs/{secret_job.pk}").json()
    assert shown["env"]["CRED_TOKEN"] == SECRET and SECRET in shown["command"]


def test_staff_allowed_to_view_see_the_job_with_its_secrets_masked(secret_job, staff):
    shown = api_client(allowed_to_view(staff)).get(f"/api/v1/training-jobs/{secret_job.pk}").json()
    assert SECRET not in str(shown)
    assert shown["env"] == {"CRED_TOKEN": MASK, "NCCL_DEBUG": "INFO"}
    assert {"name": "lr", "value": "0.1"} in shown["parameters"] and f"--api_key={MASK}" in shown["command"]


def test_the_back_offices_job_page_masks_secrets(client, secret_job, staff):
    staff = allowed_to_view(staff)
    client.force_login(staff)
    page = client.get(f"/admin/jobs/trainingjob/{secret_job.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert SECRET not in text and f"CRED_TOKEN={MASK}" in text and "--lr=0.1" in text


def test_the_consoles_log_masks_secrets_in_the_commands_it_records():
    record = logging.LogRecord("asyncssh", logging.INFO, __file__, 1, "[conn=2, chan=0]   Command: %s", (
        f"cd /x && exec mpirun python train.py --api_key={SECRET} CRED_X=abc",), None)
    MaskSecretsFilter().filter(record)
    assert SECRET not in record.getMessage() and "abc" not in record.getMessage()
    assert "Command: cd /x && exec mpirun python train.py" in record.getMessage()
