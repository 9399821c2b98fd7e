"""Who may see and act on a job, through the pages and the API alike, and the pages' language."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from jobs.code_dirs.service import register
from jobs.models import JobStatus, LogLine, MetricPoint, TrainingJob
from tests.fixtures import api_client, person

pytestmark = pytest.mark.django_db


def browser_of(user) -> Client:
    """The pages as the user's browser reaches them, signed in."""
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def pages(owner) -> Client:
    """The owner's browser."""
    return browser_of(owner)


def test_a_stranger_neither_sees_nor_reaches_the_owners_job_on_the_pages(make_job, stranger):
    job = make_job(name="owners-job", status=JobStatus.PENDING)
    pages = browser_of(stranger)

    listing = pages.get("/")

    assert listing.status_code == 200
    assert "owners-job" not in listing.content.decode()
    assert pages.get(f"/jobs/{job.pk}").status_code == 404
    assert pages.get(f"/jobs/{job.pk}/rebuild").status_code == 404
    assert pages.post(f"/jobs/{job.pk}/stop").status_code == 404
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING


def test_a_stranger_neither_sees_nor_stops_the_owners_job_through_the_api(make_job, stranger):
    job = make_job(status=JobStatus.PENDING)
    api = api_client(stranger)

    listing = api.get("/api/v1/training-jobs").json()
    assert [item["id"] for item in (listing["results"] if isinstance(listing, dict) else listing)] == []
    assert api.get(f"/api/v1/training-jobs/{job.pk}").status_code == 404
    assert api.get(f"/api/v1/training-jobs/{job.pk}/log/lines").status_code == 404
    assert api.post(f"/api/v1/training-jobs/{job.pk}/stop").status_code == 404
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING


def test_a_stranger_cannot_delete_the_owners_finished_job(make_job, stranger):
    job = make_job(status=JobStatus.COMPLETED)

    assert browser_of(stranger).post(f"/jobs/{job.pk}/delete").status_code == 404
    assert TrainingJob.objects.filter(pk=job.pk).exists()


def test_the_owner_stops_a_queued_job_from_its_page_and_it_ends_terminated(make_job, pages):
    job = make_job(status=JobStatus.PENDING)

    response = pages.post(f"/jobs/{job.pk}/stop", {"next": "/"})

    assert response.status_code == 302 and response["Location"] == "/"
    job.refresh_from_db()
    assert job.status == JobStatus.TERMINATED


def test_a_stop_that_would_leave_the_site_returns_to_the_job_instead(make_job, pages):
    job = make_job(status=JobStatus.PENDING)

    response = pages.post(f"/jobs/{job.pk}/stop", {"next": "https://elsewhere.example/"})

    assert response["Location"] == f"/jobs/{job.pk}"


def test_a_running_job_is_not_deleted_and_a_finished_one_is(make_job, pages):
    running = make_job(name="running", status=JobStatus.RUNNING)
    finished = make_job(name="finished", status=JobStatus.FAILED)

    pages.post(f"/jobs/{running.pk}/delete")
    pages.post(f"/jobs/{finished.pk}/delete")

    assert TrainingJob.objects.filter(pk=running.pk).exists()
    assert not TrainingJob.objects.filter(pk=finished.pk).exists()


def test_staff_given_the_permissions_see_everyones_jobs_and_can_stop_them(make_job):
    job = make_job(name="owners-job", status=JobStatus.PENDING)
    admin = person("admin", is_staff=True)
    admin.user_permissions.add(*Permission.objects.filter(codename__in=["view_trainingjob", "change_trainingjob"]))
    pages = browser_of(admin)

    assert "owners-job" in pages.get("/").content.decode()
    assert pages.get(f"/jobs/{job.pk}").status_code == 200
    assert "owners-job" not in pages.get("/?mine=1").content.decode()
    pages.post(f"/jobs/{job.pk}/stop")
    job.refresh_from_db()
    assert job.status == JobStatus.TERMINATED


def test_pages_ask_for_a_login_first(make_job):
    job = make_job()
    anonymous = Client()

    for url in ("/", "/jobs/new", f"/jobs/{job.pk}", f"/jobs/{job.pk}/rebuild"):
        response = anonymous.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), url
    assert anonymous.post("/jobs/preview").status_code == 302


def test_a_stop_without_the_csrf_token_is_refused(make_job, owner):
    job = make_job(status=JobStatus.PENDING)
    pages = Client(enforce_csrf_checks=True)
    pages.force_login(owner)

    assert pages.post(f"/jobs/{job.pk}/stop").status_code == 403
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING


def test_the_job_list_filters_by_state_and_name_and_pages(make_job, pages):
    for number in range(25):
        make_job(name=f"sweep-{number:02d}", status=JobStatus.COMPLETED)
    make_job(name="other-run", status=JobStatus.FAILED)

    failed = pages.get("/?state=Failed").content.decode()
    searched = pages.get("/?q=sweep").content.decode()
    second_page = pages.get("/?q=sweep&page=2").content.decode()

    assert "other-run" in failed and "sweep-" not in failed
    assert "other-run" not in searched and searched.count('data-job-id="') == 20
    assert second_page.count('data-job-id="') == 5
    assert "Page 2 of 2 (25 jobs)" in second_page


def test_the_job_page_masks_secret_variables_and_parameters(make_job, pages):
    job = make_job(status=JobStatus.COMPLETED, env={"CRED_TOKEN": "hunter2", "GREETING": "hello"},
                   command="mpirun -np 2 python /x/train.py --lr=0.1 --db_password=hunter3",
                   tune_file="-x CRED_TOKEN\n-x MA_NUM_HOSTS\n")
    job.parameters = [{"name": "db_password", "value": "hunter3"}]
    job.save()

    page = pages.get(f"/jobs/{job.pk}").content.decode()

    assert "hunter2" not in page and "hunter3" not in page
    assert "CRED_TOKEN=******" in page and "--db_password=******" in page
    assert "GREETING=hello" in page


def test_the_logs_rank_list_names_each_ranks_worker_so_that_choosing_a_worker_offers_only_its_ranks(make_job, pages):
    by_slot = make_job(name="by-slot", status=JobStatus.RUNNING)
    by_node = make_job(name="by-node", status=JobStatus.RUNNING, bind_args="-map-by node")
    kept = make_job(name="kept", status=JobStatus.RUNNING, launch_cursor={"rank_workers": [1, 1, 0, 0]})

    def rank_options(job):
        page = pages.get(f"/jobs/{job.pk}").content.decode()
        select = re.search(r"<select data-log-rank>(.*?)</select>", page, re.S).group(1)
        return re.findall(r'<option value="(\d+)" data-worker="(\d+)">', select)

    assert rank_options(by_slot) == [("0", "0"), ("1", "0"), ("2", "1"), ("3", "1")]
    assert rank_options(by_node) == [("0", "0"), ("1", "1"), ("2", "0"), ("3", "1")]
    assert rank_options(kept) == [("0", "1"), ("1", "1"), ("2", "0"), ("3", "0")], "where the launch put them"


def test_the_pages_follow_the_browsers_language_and_the_switch(pages):
    assert "Criar trabalho de treinamento" in pages.get("/jobs/new", HTTP_ACCEPT_LANGUAGE="pt-BR,pt;q=0.9").content.decode()
    assert "Create training job" in pages.get("/jobs/new", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    pages.post("/i18n/setlang/", {"language": "pt-br", "next": "/"})
    assert "Trabalhos de treinamento" in pages.get("/", HTTP_ACCEPT_LANGUAGE="en").content.decode()


def test_a_form_refused_in_portuguese_says_why_in_portuguese(make_job, pages, tmp_path):
    (tmp_path / "train.py").write_text("")
    # An engine, a spec and a code directory the owner may use, so that the name and the boot file are what is refused.
    offered = make_job(code_dir=register("mnist", tmp_path, sharing="everyone"))
    page = pages.post("/jobs/new", {
        "name": "bad name!", "engine": offered.engine_version.pk, "code_dir": offered.code_dir.pk, "boot_file": "../x.py",
        "spec": offered.spec.pk, "node_count": "1"}, HTTP_ACCEPT_LANGUAGE="pt-BR").content.decode()

    assert "Use de 1 a 64 letras, dígitos, &#x27;-&#x27; ou &#x27;_&#x27;." in page
    assert "Informe um caminho dentro do diretório de código, como train.py." in page


def test_the_list_stops_and_deletes_the_ticked_jobs_and_says_which_it_could_not(make_job, stranger, pages):
    queued = make_job(name="queued", status=JobStatus.PENDING)
    finished = make_job(name="finished", status=JobStatus.COMPLETED)
    others = make_job(owner=stranger, name="not-mine", status=JobStatus.COMPLETED)

    stopped = pages.post("/jobs/bulk", {"action": "stop", "ids": [queued.pk, finished.pk]}, follow=True).content.decode()
    deleted = pages.post("/jobs/bulk", {"action": "delete", "ids": [queued.pk, finished.pk, others.pk]}, follow=True)

    assert "Stop requested for: queued." in stopped and "Not stopped (not running, or not yours to stop): finished." in stopped
    assert "Deleted: " in deleted.content.decode()
    assert not TrainingJob.objects.filter(pk__in=[queued.pk, finished.pk]).exists()
    assert TrainingJob.objects.filter(pk=others.pk).exists(), "a job the user cannot see is left alone"
    assert pages.post("/jobs/bulk", {"action": "stop", "ids": ["x", "'; drop"]}).status_code == 302


def test_the_list_filters_by_time_and_its_rows_poll_only_while_a_job_is_unfinished(make_job, pages):
    old = make_job(name="last-month", status=JobStatus.COMPLETED)
    TrainingJob.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=20))
    make_job(name="today", status=JobStatus.COMPLETED)

    recent = pages.get("/?within=7d").content.decode()
    rows = pages.get("/?within=30d", HTTP_HX_REQUEST="true").content.decode()

    assert "today" in recent and "last-month" not in recent
    assert rows.lstrip().startswith("<tbody") and "last-month" in rows and "hx-get" not in rows
    make_job(name="running-now", status=JobStatus.RUNNING)
    assert "hx-trigger" in pages.get("/", HTTP_HX_REQUEST="true").content.decode()
    assert pages.get("/?within=forever&mine=1&state=Nope").status_code == 200


def test_rebuild_offers_the_name_with_copy_and_a_stop_is_signed_in_the_timeline(make_job, pages):
    job = make_job(name="trainer", status=JobStatus.PENDING)

    assert 'value="trainer-copy"' in pages.get(f"/jobs/{job.pk}/rebuild").content.decode()
    make_job(name="trainer-copy", status=JobStatus.COMPLETED)
    assert 'value="trainer-copy-2"' in pages.get(f"/jobs/{job.pk}/rebuild").content.decode()
    pages.post(f"/jobs/{job.pk}/stop")
    assert "Stop requested by owner" in pages.get(f"/jobs/{job.pk}").content.decode()


def test_a_users_stop_is_one_signed_entry_on_the_timeline_from_the_request_to_the_end(make_job, pages):
    from jobs.models import RunOutcome
    from jobs.runtime.ending import settle

    running = make_job(name="running", status=JobStatus.RUNNING)
    queued = make_job(name="queued", status=JobStatus.PENDING)
    pages.post(f"/jobs/{running.pk}/stop")
    pages.post("/jobs/bulk", {"action": "stop", "ids": [queued.pk]})
    settle(running.pk, RunOutcome.STOPPED, None, "stopped", [])

    assert [(event.kind, event.message) for event in running.events.order_by("id")] == [
        ("state:Terminating", "Stop requested by owner"), ("state:Terminated", "Stopped by the user")]
    assert [(event.kind, event.message) for event in queued.events.order_by("id")] == [
        ("state:Terminated", "Stop requested by owner")]
    timeline = re.search(r'id="job-timeline">(.*?)</section>', pages.get(f"/jobs/{running.pk}").content.decode(), re.S)
    assert timeline.group(1).count("Stop requested") == 1


def test_a_failed_jobs_header_says_why_in_plain_words_and_the_live_parts_stop_polling_once_it_ended(make_job, pages):
    job = make_job(name="lost", status=JobStatus.FAILED,
                   status_message="internal error: asyncssh.misc.ConnectionLost('Connection lost')")

    page = pages.get(f"/jobs/{job.pk}").content.decode()
    live = pages.get(f"/jobs/{job.pk}/live").content.decode()

    assert "the connection to the node was lost (Connection lost)" in page and "ConnectionLost(" not in page
    assert 'id="job-poller" hx-swap-oob="true"></div>' in live and 'hx-swap-oob="true"' in live
    running = make_job(name="still-going", status=JobStatus.RUNNING)
    assert "hx-trigger" in pages.get(f"/jobs/{running.pk}/live").content.decode()
    missing = pages.get("/jobs/999999")
    assert missing.status_code == 404


def test_the_pages_log_download_puts_each_lines_time_before_it(make_job, pages):
    job = make_job(name="logged", status=JobStatus.COMPLETED, log_line_count=2)
    LogLine.objects.create(job=job, seq=1, rank=0, worker_index=0, stream="stdout", text="hello")
    LogLine.objects.create(job=job, seq=2, rank=1, worker_index=1, stream="stdout", text="other worker")

    whole = b"".join(pages.get(f"/jobs/{job.pk}/log.txt").streaming_content).decode()
    one = pages.get(f"/jobs/{job.pk}/log.txt?worker=1")

    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00 \[rank 0\] hello\n.+ \[rank 1\] other worker\n", whole)
    assert b"other worker" in b"".join(one.streaming_content) and "worker-1" in one["Content-Disposition"]
    assert pages.get(f"/jobs/{job.pk}/log.txt?worker=x").status_code == 400


def test_the_charts_first_read_gets_each_series_downsampled_with_its_ends_and_extremes(make_job, owner):
    job = make_job(name="long", status=JobStatus.COMPLETED)
    now = timezone.now()
    MetricPoint.objects.bulk_create([MetricPoint(job=job, name="loss", rank=rank, step=step, at=now, seq=1,
                                                 value=100.0 if step == 1234 else 1.0 / (step + 1))
                                     for step in range(3000) for rank in (0, 1)])
    api = api_client(owner)

    answer = api.get(f"/api/v1/training-jobs/{job.pk}/metrics?after=0&max_points=100").json()
    rank0 = [point for point in answer["points"] if point["rank"] == 0]

    assert len(rank0) <= 100 and rank0[0]["step"] == 0 and rank0[-1]["step"] == 2999
    assert any(point["value"] == 100.0 for point in rank0), "a spike survives"
    assert answer["metrics"][0]["downsampled"] and answer["more"] is False
    assert answer["next"] == MetricPoint.objects.filter(job=job).order_by("-id").first().id
    assert api.get(f"/api/v1/training-jobs/{job.pk}/metrics?max_points=99999999").status_code == 400
    assert "max_points" in api.get(f"/api/v1/training-jobs/{job.pk}/metrics?max_points=x").json()
