"""A job's own choices for when it hangs or loses a rank: what the watchdog does once it suspects the job hangs
(only warn, or stop it) and how long the job may go on after a rank ended not as 0 (seconds, at once, or never).
Each is the job's own only when its owner chose it, on the page, in the API or with tc; otherwise the default
of the day (the administrator's, or the RANK_EXIT_GRACE_SECONDS setting) is read when it is needed."""

import asyncio
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from training_console_cli.documents import submission_of, with_flags
from training_console_cli.main import parser

from jobs.allocation import try_allocate
from jobs.models import RANK_EXIT_NEVER, JobStatus, LauncherDefaults, Node, StopReason, TrainingJob
from jobs.runtime.liveness import RankEnd
from jobs.runtime.monitor import RunMonitor, StopRequest
from jobs.runtime.run import JobRun, in_own_context, plan_allocated_job
from tests.fixtures import job_body
from tests.unit.log_helpers import quiet_redis  # noqa: F401
from tests.unit.test_job_run import FakeNodes


@pytest.fixture
def submit(api, catalogue):
    """Submit through the API: the job it made (the queue hears of it after a commit these tests never make)."""
    return lambda body: TrainingJob.objects.get(pk=api.post("/api/v1/training-jobs", body, format="json").json()["id"])


def administrator_lets_the_watchdog_stop(may_stop: bool) -> None:
    LauncherDefaults.objects.filter(pk=LauncherDefaults.current().pk).update(watchdog_seconds=60,
                                                                             watchdog_may_stop=may_stop)


async def stop_asked(reason: str, message: str) -> None:
    raise AssertionError("tick() returns the stop; run() would carry it out")


def one_tick_of_a_silent_job(make_job, action: str | None) -> tuple[StopRequest | None, TrainingJob]:
    job = make_job(status=JobStatus.RUNNING, started_at=timezone.now(), watchdog_action=action)
    monitor = RunMonitor(job.pk, (0, 0, 1, 1), {0: "node-a", 1: "node-b"}, stop_asked)
    now = timezone.now()
    monitor.last_heard = {0: now, 1: now - timedelta(seconds=90), 2: now, 3: now}
    request = monitor.tick()
    job.refresh_from_db()
    return request, job


@pytest.mark.django_db
def test_an_owner_who_asked_for_a_stop_has_a_silent_job_stopped_though_the_administrator_only_warns(make_job):
    administrator_lets_the_watchdog_stop(False)

    request, job = one_tick_of_a_silent_job(make_job, "stop")

    assert request == StopRequest(StopReason.WATCHDOG,
                                  "Stopped by the watchdog: rank(s) 1 printed nothing for more than 60 s")
    assert [entry["rank"] for entry in job.silent_ranks] == [1]


@pytest.mark.django_db
def test_an_owner_who_asked_only_for_a_warning_is_warned_though_the_administrator_lets_the_watchdog_stop(make_job):
    administrator_lets_the_watchdog_stop(True)

    request, job = one_tick_of_a_silent_job(make_job, "warn")

    assert request is None
    assert job.suspected_hung_since is not None and [entry["rank"] for entry in job.silent_ranks] == [1]


@pytest.mark.django_db
def test_a_past_hang_is_said_with_the_limit_it_was_measured_against_after_the_administrator_changes_the_default(
        make_job, client, owner):
    administrator_lets_the_watchdog_stop(False)
    _, job = one_tick_of_a_silent_job(make_job, None)
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.FAILED, owner=owner)
    LauncherDefaults.objects.filter(pk=LauncherDefaults.current().pk).update(watchdog_seconds=600)

    client.force_login(owner)
    page = client.get(f"/jobs/{job.pk}").content.decode()
    assert "Rank(s) below printed nothing for more than 60 s." in page
    results = client.get(f"/api/v1/training-jobs/{job.pk}/outcome").json()
    assert results["suspected_hung"]["watchdog_seconds"] == 60


@pytest.mark.django_db
@pytest.mark.parametrize("may_stop", [True, False])
def test_an_owner_who_chose_nothing_gets_what_the_administrator_chose(make_job, may_stop):
    administrator_lets_the_watchdog_stop(may_stop)

    request, _job = one_tick_of_a_silent_job(make_job, None)

    assert (request is not None) == may_stop


@pytest.mark.django_db
def test_an_api_submission_keeps_the_choices_made_and_shows_a_grace_of_never_as_off(api, submit):
    job = submit(job_body(watchdog_action="stop", rank_exit_grace_seconds="off"))
    other = submit(job_body(name="train-2", rank_exit_grace_seconds=0))
    plain = submit(job_body(name="train-3"))

    assert (job.watchdog_action, job.rank_exit_grace_seconds) == ("stop", RANK_EXIT_NEVER)
    assert (other.watchdog_action, other.rank_exit_grace_seconds) == (None, 0)
    assert (plain.watchdog_action, plain.rank_exit_grace_seconds) == (None, None), "nothing chosen: the defaults"
    detail = api.get(f"/api/v1/training-jobs/{job.pk}").json()
    assert (detail["watchdog_action"], detail["rank_exit_grace_seconds"]) == ("stop", "off")
    assert api.get(f"/api/v1/training-jobs/{other.pk}").json()["rank_exit_grace_seconds"] == 0


@pytest.mark.django_db
@pytest.mark.parametrize("field, value", [
    ("watchdog_action", "kill"), ("rank_exit_grace_seconds", "soon"), ("rank_exit_grace_seconds", -1),
    ("rank_exit_grace_seconds", 1.5), ("rank_exit_grace_seconds", True), ("rank_exit_grace_seconds", 10**9),
    ("rank_exit_grace_seconds", "9" * 5000),
])
def test_a_choice_the_console_does_not_know_is_refused_on_its_field(api, catalogue, field, value):
    response = api.post("/api/v1/training-jobs", job_body(**{field: value}), format="json")

    assert response.status_code == 400
    assert list(response.json()) == [field] and response.json()[field][0]


@pytest.mark.django_db
def test_the_rebuild_page_offers_the_choices_the_owner_made_and_leaves_the_others_at_the_defaults(client, owner, submit):
    chose = submit(job_body(watchdog_action="warn", rank_exit_grace_seconds="off"))
    left = submit(job_body(name="train-2"))
    client.force_login(owner)

    page = client.get(f"/jobs/{chose.pk}/rebuild").content.decode()
    plain = client.get(f"/jobs/{left.pk}/rebuild").content.decode()

    assert '<option value="warn" selected>' in page and 'name="rank_exit_grace_seconds"' in page
    assert 'value="off"' in page.split('id="id_rank_exit_grace_seconds"', 1)[1].split(">", 1)[0]
    assert '<option value="" selected>' in plain.split('id="id_watchdog_action"', 1)[1]
    assert 'value=""' in plain.split('id="id_rank_exit_grace_seconds"', 1)[1].split(">", 1)[0]


@pytest.mark.django_db
def test_a_choice_typed_wrong_on_the_page_is_kept_and_said_beside_its_field(client, owner, catalogue):
    client.force_login(owner)
    form = {**job_body(), "rank_exit_grace_seconds": "a minute", "watchdog_action": "stop"}
    form.pop("parameters"), form.pop("env")

    page = client.post("/jobs/new", form).content.decode()

    after = page.split('id="id_rank_exit_grace_seconds"', 1)[1]
    assert 'value="a minute"' in after.split(">", 1)[0]
    assert "Give a number of seconds from 0 to 604800, or off." in after
    assert '<option value="stop" selected>' in page


@pytest.mark.django_db
def test_tc_submit_sends_the_flags_and_tc_rebuild_copies_the_choices_and_only_them(api, submit):
    args = parser().parse_args(["submit", "--watchdog-action", "stop", "--rank-exit-grace", "off"])
    body = with_flags(job_body(), {"watchdog_action": args.watchdog_action,
                                   "rank_exit_grace_seconds": args.rank_exit_grace_seconds}, [], [])
    job = submit(body)
    plain = submit(job_body(name="train-2"))

    copy = submit({**submission_of(api.get(f"/api/v1/training-jobs/{job.pk}").json(), None), "name": "copy-1"})
    plain_copy = submit({**submission_of(api.get(f"/api/v1/training-jobs/{plain.pk}").json(), None), "name": "copy-2"})

    assert (copy.watchdog_action, copy.rank_exit_grace_seconds) == ("stop", RANK_EXIT_NEVER)
    assert (plain_copy.watchdog_action, plain_copy.rank_exit_grace_seconds) == (None, None)
    assert parser().parse_args(["submit", "--rank-exit-grace", "0"]).rank_exit_grace_seconds == 0


def test_tc_refuses_a_grace_or_an_action_it_does_not_know_before_asking_the_console():
    for argv in (["submit", "--rank-exit-grace", "-3"], ["submit", "--watchdog-action", "kill"]):
        with pytest.raises(SystemExit) as refusal:
            parser().parse_args(argv)
        assert refusal.value.code == 2


@pytest.fixture
def allocated_job(make_job, transactional_db, quiet_redis):  # noqa: F811 - the fixture imported above
    job = make_job(name="train", node_count=2, bind_args="-bind-to none -map-by slot")
    for name, address in (("node-a", "10.0.0.1"), ("node-b", "10.0.0.2")):
        Node.objects.create(name=name, address=address, spec=job.spec)
    assert try_allocate(job)
    return job


def test_a_job_whose_grace_is_off_says_a_ranks_end_but_is_never_failed_for_it(allocated_job, settings):
    settings.RANK_EXIT_GRACE_SECONDS = 1.0
    TrainingJob.objects.filter(pk=allocated_job.pk).update(rank_exit_grace_seconds=RANK_EXIT_NEVER)
    job_run = JobRun(plan_allocated_job(allocated_job))

    asyncio.run(in_own_context(job_run.rank_ended({1: RankEnd(1, 0, "ended with exit code 3", time.time())})))

    assert job_run.failing_for_rank_end is None, "no countdown to the job's end"
    assert allocated_job.events.filter(kind="rank-ended", message__startswith="Rank 1 (worker-0, node-a) ended").exists()


def test_a_job_whose_grace_is_0_is_failed_at_once_though_the_setting_gives_a_minute(allocated_job, settings,
                                                                                    monkeypatch):
    settings.RANK_EXIT_GRACE_SECONDS = 60.0
    TrainingJob.objects.filter(pk=allocated_job.pk).update(rank_exit_grace_seconds=0)
    nodes = FakeNodes(monkeypatch)
    nodes.exit_status = 1
    nodes.rank_ends = {1: RankEnd(1, 0, "ended with exit code 3", time.time())}

    started = time.monotonic()
    asyncio.run(in_own_context(JobRun(plan_allocated_job(allocated_job)).execute()))

    allocated_job.refresh_from_db()
    assert time.monotonic() - started < 30
    assert allocated_job.status == JobStatus.FAILED
    assert allocated_job.status_message.startswith("Rank 1 ended with exit code 3, and the other ranks waited for it: "
                                                   "the job was ended 0 s later")


@pytest.mark.django_db
def test_the_job_page_says_what_the_watchdog_does_and_how_long_a_ranks_failed_end_is_waited_for(client, owner, submit,
                                                                                               settings):
    settings.RANK_EXIT_GRACE_SECONDS = 45.0
    administrator_lets_the_watchdog_stop(False)
    chose = submit(job_body(watchdog_action="stop", rank_exit_grace_seconds="off"))
    left = submit(job_body(name="train-2"))
    client.force_login(owner)

    def settings_of(job: TrainingJob) -> str:
        page = client.get(f"/jobs/{job.pk}").content.decode()
        return " ".join(page.split("<dt>Watchdog</dt>", 1)[1].split("<dt>Created</dt>", 1)[0].split())

    assert "60 s · stops the job" in settings_of(chose) and "failed end</dt><dd>Off</dd>" in settings_of(chose)
    assert "60 s · only warns" in settings_of(left) and "failed end</dt><dd>45 s</dd>" in settings_of(left)
