"""Who may see and act on a job, through the pages and the API alike, and the pages' language."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from rest_framework.test import APIClient

from jobs.code_dirs import register
from jobs.models import Engine, EngineVersion, JobStatus, LauncherDefaults, ResourceSpec, TrainingJob

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalog(tmp_path):
    code = tmp_path / "mnist"
    code.mkdir()
    (code / "train.py").write_text("")
    LauncherDefaults.current()
    return {
        "engine": EngineVersion.objects.create(engine=Engine.objects.create(name="MPI"), version="mpi-4.1"),
        "spec": ResourceSpec.objects.create(name="cpu-2", cpu_cores=2, memory_gb=4, cpu_slots_per_node=2),
        "code_dir": register("mnist", code, sharing="everyone"),
    }


def make_user(name: str, **extra):
    return get_user_model().objects.create_user(name, password=f"{name}-password", **extra)


@pytest.fixture
def owner():
    return make_user("owner")


@pytest.fixture
def stranger():
    return make_user("stranger")


def make_job(catalog, owner, name="owners-job", status=JobStatus.RUNNING, **fields) -> TrainingJob:
    return TrainingJob.objects.create(
        name=name, owner=owner, engine_version=catalog["engine"], code_dir=catalog["code_dir"], boot_file="train.py",
        spec=catalog["spec"], status=status, parameters=[{"name": "lr", "value": "0.1"}], **fields)


def browser_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def api_of(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_a_stranger_neither_sees_nor_reaches_the_owners_job_on_the_pages(catalog, owner, stranger):
    job = make_job(catalog, owner, status=JobStatus.PENDING)
    pages = browser_of(stranger)

    listing = pages.get("/")

    assert listing.status_code == 200
    assert "owners-job" not in listing.content.decode()
    assert pages.get(f"/jobs/{job.pk}").status_code == 404
    assert pages.get(f"/jobs/{job.pk}/rebuild").status_code == 404
    assert pages.post(f"/jobs/{job.pk}/stop").status_code == 404
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING


def test_a_stranger_neither_sees_nor_stops_the_owners_job_through_the_api(catalog, owner, stranger):
    job = make_job(catalog, owner, status=JobStatus.PENDING)
    api = api_of(stranger)

    assert [item["id"] for item in api.get("/api/v1/training-jobs").json()] == []
    assert api.get(f"/api/v1/training-jobs/{job.pk}").status_code == 404
    assert api.get(f"/api/v1/training-jobs/{job.pk}/log/lines").status_code == 404
    assert api.post(f"/api/v1/training-jobs/{job.pk}/stop").status_code == 404
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING


def test_a_stranger_cannot_delete_the_owners_finished_job(catalog, owner, stranger):
    job = make_job(catalog, owner, status=JobStatus.COMPLETED)

    assert browser_of(stranger).post(f"/jobs/{job.pk}/delete").status_code == 404
    assert TrainingJob.objects.filter(pk=job.pk).exists()


def test_the_owner_stops_a_queued_job_from_its_page_and_it_ends_terminated(catalog, owner):
    job = make_job(catalog, owner, status=JobStatus.PENDING)

    response = browser_of(owner).post(f"/jobs/{job.pk}/stop", {"next": "/"})

    assert response.status_code == 302 and response["Location"] == "/"
    job.refresh_from_db()
    assert job.status == JobStatus.TERMINATED


def test_a_stop_that_would_leave_the_site_returns_to_the_job_instead(catalog, owner):
    job = make_job(catalog, owner, status=JobStatus.PENDING)

    response = browser_of(owner).post(f"/jobs/{job.pk}/stop", {"next": "https://elsewhere.example/"})

    assert response["Location"] == f"/jobs/{job.pk}"


def test_a_running_job_is_not_deleted_and_a_finished_one_is(catalog, owner):
    running = make_job(catalog, owner, name="running")
    finished = make_job(catalog, owner, name="finished", status=JobStatus.FAILED)
    pages = browser_of(owner)

    pages.post(f"/jobs/{running.pk}/delete")
    pages.post(f"/jobs/{finished.pk}/delete")

    assert TrainingJob.objects.filter(pk=running.pk).exists()
    assert not TrainingJob.objects.filter(pk=finished.pk).exists()


def test_staff_given_the_permissions_see_everyones_jobs_and_can_stop_them(catalog, owner):
    job = make_job(catalog, owner, status=JobStatus.PENDING)
    admin = make_user("admin", is_staff=True)
    admin.user_permissions.add(*Permission.objects.filter(codename__in=["view_trainingjob", "change_trainingjob"]))
    pages = browser_of(admin)

    assert "owners-job" in pages.get("/").content.decode()
    assert pages.get(f"/jobs/{job.pk}").status_code == 200
    assert "owners-job" not in pages.get("/?mine=1").content.decode()
    pages.post(f"/jobs/{job.pk}/stop")
    job.refresh_from_db()
    assert job.status == JobStatus.TERMINATED


def test_pages_ask_for_a_login_first(catalog, owner):
    job = make_job(catalog, owner)
    anonymous = Client()

    for url in ("/", "/jobs/new", f"/jobs/{job.pk}", f"/jobs/{job.pk}/rebuild"):
        response = anonymous.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), url
    assert anonymous.post("/jobs/preview").status_code == 302


def test_a_stop_without_the_csrf_token_is_refused(catalog, owner):
    job = make_job(catalog, owner, status=JobStatus.PENDING)
    pages = Client(enforce_csrf_checks=True)
    pages.force_login(owner)

    assert pages.post(f"/jobs/{job.pk}/stop").status_code == 403
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING


def test_the_job_list_filters_by_state_and_name_and_pages(catalog, owner):
    for number in range(25):
        make_job(catalog, owner, name=f"sweep-{number:02d}", status=JobStatus.COMPLETED)
    make_job(catalog, owner, name="other-run", status=JobStatus.FAILED)
    pages = browser_of(owner)

    failed = pages.get("/?state=Failed").content.decode()
    searched = pages.get("/?q=sweep").content.decode()
    second_page = pages.get("/?q=sweep&page=2").content.decode()

    assert "other-run" in failed and "sweep-" not in failed
    assert "other-run" not in searched and searched.count('data-job-id="') == 20
    assert second_page.count('data-job-id="') == 5
    assert "Page 2 of 2 (25 jobs)" in second_page


def test_the_job_page_masks_secret_variables_and_parameters(catalog, owner):
    job = make_job(catalog, owner, status=JobStatus.COMPLETED, env={"CRED_TOKEN": "hunter2", "GREETING": "hello"},
                   command="mpirun -np 2 python /x/train.py --lr=0.1 --db_password=hunter3",
                   tune_file="-x CRED_TOKEN\n-x MA_NUM_HOSTS\n")
    job.parameters = [{"name": "db_password", "value": "hunter3"}]
    job.save()

    page = browser_of(owner).get(f"/jobs/{job.pk}").content.decode()

    assert "hunter2" not in page and "hunter3" not in page
    assert "CRED_TOKEN=******" in page and "--db_password=******" in page
    assert "GREETING=hello" in page


def test_the_pages_follow_the_browsers_language_and_the_switch(catalog, owner):
    pages = browser_of(owner)

    assert "Criar trabalho de treinamento" in pages.get("/jobs/new", HTTP_ACCEPT_LANGUAGE="pt-BR,pt;q=0.9").content.decode()
    assert "Create training job" in pages.get("/jobs/new", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    pages.post("/i18n/setlang/", {"language": "pt-br", "next": "/"})
    assert "Trabalhos de treinamento" in pages.get("/", HTTP_ACCEPT_LANGUAGE="en").content.decode()


def test_a_form_refused_in_portuguese_says_why_in_portuguese(catalog, owner):
    page = browser_of(owner).post("/jobs/new", {
        "name": "bad name!", "engine": catalog["engine"].pk, "code_dir": catalog["code_dir"].pk, "boot_file": "../x.py",
        "spec": catalog["spec"].pk, "node_count": "1"}, HTTP_ACCEPT_LANGUAGE="pt-BR").content.decode()

    assert "Use de 1 a 64 letras, dígitos, &#x27;-&#x27; ou &#x27;_&#x27;." in page
    assert "Informe um caminho dentro do diretório de código, como train.py." in page
