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


def test_rebuild_sends_no_secret_back_and_keeps_the_old_one_unless_retyped(client, owner, settings, tmp_path):
    from jobs.code_dirs.service import register
    from jobs.models import Engine, EngineVersion, LauncherDefaults, ResourceSpec, TrainingJob
    from tests.fixtures import add_nodes

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("")
    register("code", code, sharing="everyone")
    EngineVersion.objects.create(engine=Engine.objects.create(name="MPI"), version="v1", image="x")
    add_nodes(ResourceSpec.objects.create(name="cpu", cpu_cores=2, memory_gb=4, cpu_slots_per_node=2), 2)
    LauncherDefaults.current()
    client.force_login(owner)
    first = client.post("/jobs/new", {"name": "first", "engine": "v1", "code_dir": "code", "boot_file": "train.py",
                                      "spec": "cpu", "node_count": "1", "env_name": ["CRED_TOKEN", "PLAIN"],
                                      "env_value": [SECRET, "1"], "param_name": ["api_key"], "param_value": [SECRET]})
    assert first.status_code == 302
    old = TrainingJob.objects.get(name="first")

    page = client.get(f"/jobs/{old.pk}/rebuild").content.decode()
    assert SECRET not in page and "unchanged unless you type a new value" in page

    kept = {"name": "kept", "engine": "v1", "code_dir": "code", "boot_file": "train.py", "spec": "cpu",
            "node_count": "1", "rebuild_of": str(old.pk), "env_name": ["CRED_TOKEN", "PLAIN"], "env_value": ["", "1"],
            "param_name": ["api_key"], "param_value": [""]}
    assert client.post("/jobs/new", kept).status_code == 302
    rebuilt = TrainingJob.objects.get(name="kept")
    assert rebuilt.env == {"CRED_TOKEN": SECRET, "PLAIN": "1"}
    assert rebuilt.parameters == [{"name": "api_key", "value": SECRET}]
    retyped = {**kept, "name": "retyped", "env_value": ["new-secret-value", "1"]}
    assert client.post("/jobs/new", retyped).status_code == 302
    assert TrainingJob.objects.get(name="retyped").env["CRED_TOKEN"] == "new-secret-value"


def test_rebuilding_anothers_job_carries_none_of_its_secrets(client, owner, stranger, make_job):
    from jobs.submission.forms import with_kept_secrets

    theirs = make_job(owner=owner, env={"CRED_TOKEN": SECRET})
    client.force_login(stranger)
    # The view only uses a source job of the user's own (a stranger's rebuild_of is ignored).
    from jobs.pages.views import _rebuild_source

    class Request:
        POST = {"rebuild_of": str(theirs.pk)}
        user = stranger

    assert _rebuild_source(Request()) is None
    assert with_kept_secrets({"env": [{"name": "CRED_TOKEN", "value": ""}]}, theirs)["env"][0]["value"] == SECRET


def test_staff_allowed_to_view_see_no_secret_on_the_job_page_or_its_rebuild(client, make_job, owner, staff):
    job = make_job(owner=owner, extra_args=f"-x MY_TOKEN={SECRET}", env={"CRED_X": SECRET},
                   parameters=[{"name": "train_url", "value": "/out"}, {"name": "api_key", "value": SECRET}])
    client.force_login(allowed_to_view(staff))
    for path in (f"/jobs/{job.pk}", f"/jobs/{job.pk}/rebuild"):
        page = client.get(path)
        assert page.status_code == 200 and SECRET not in page.content.decode(), path
