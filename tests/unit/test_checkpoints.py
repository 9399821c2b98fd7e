"""The checkpoint contract, the pure parts and the records: what a manifest may say, what the program's
environment holds, the notice's limits in the form, the watch against a faked container, and the work an
attempt lost. The real runs (a stop's notice, an auto restart that resumes) are in
tests/integration/test_checkpoints.py."""

import asyncio
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from jobs.launch.checkpoint_contract import (
    CHECKPOINT_DIR,
    CheckpointClaim,
    ManifestError,
    checkpoint_variables,
    claimed_files,
    parse_manifest,
)
from jobs.launch.plan import KeyPair, SshTarget, WorkerValues, plan_job
from jobs.models import Attempt, Checkpoint, JobEvent, JobStatus, LauncherDefaults, MetricPoint
from jobs.results.checkpoints import (
    close_attempt,
    lost_work,
    lost_work_words,
    notice_grace,
    record_checkpoint,
    warn_checkpoint,
)
from jobs.runtime import checkpoints as runtime_checkpoints
from jobs.runtime.checkpoints import CheckpointWatch
from tests.unit.test_slurm_client import job_values


def test_a_manifest_names_a_step_and_a_path_inside_the_checkpoint_folder():
    assert parse_manifest('{"step": 1200, "path": "step-1200.pt", "time": "12:00"}') == \
        CheckpointClaim(1200, "step-1200.pt", "12:00")
    assert parse_manifest('{"step": 0, "path": "./runs/a/"}').path == "runs/a"
    # The program's time is shown without what a page must not show (lone surrogates, controls, overrides).
    assert parse_manifest('{"step": 2, "path": "ck1.pt", "time": "\\udc80\\ud80012:00\\u202e\\u0007"}').time == "12:00"
    assert parse_manifest('{"step": 2, "path": "\u6a21\u578b/ck 1.pt"}').path == "\u6a21\u578b/ck 1.pt"
    # The folder's own absolute path is taken as the same place.
    assert parse_manifest(f'{{"step": 3, "path": "{CHECKPOINT_DIR}/step-3.npz"}}').path == "step-3.npz"


@pytest.mark.parametrize(("text", "words"), [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "is not a JSON object"),
    ('{"step": -1, "path": "a"}', "step must be a whole number"),
    ('{"step": true, "path": "a"}', "step must be a whole number"),
    ('{"step": "5", "path": "a"}', "step must be a whole number"),
    ('{"step": 5}', "path must name"),
    ('{"step": 5, "path": "../../etc/passwd"}', "is not inside"),
    ('{"step": 5, "path": "/etc/passwd"}', "is not inside"),
    ('{"step": 5, "path": "a\\u001b[2Jb"}', "is not inside"),
    ('{"step": 5, "path": "checkpoint.json"}', "names the manifest itself"),
    ('{"step": 5, "path": "ck\\udc80.pt"}', "holds characters a checkpoint's name may not"),
    ('{"step": 5, "path": "ck7\\u202egp.pt"}', "holds characters a checkpoint's name may not"),
    ('{"step": 5, "path": "' + "a" * 5000 + '"}', "larger than 4096 bytes"),
    ("[" * 4000, "nested too deeply"),
])
def test_a_manifest_the_console_cannot_trust_is_refused_saying_why(text, words):
    with pytest.raises(ManifestError, match=words.replace("(", r"\(").replace("[", r"\[")):
        parse_manifest(text)


def test_a_claim_is_the_file_it_names_or_every_file_under_the_folder_it_names_and_nothing_else():
    found = {"checkpoints/step-3.pt": 10, "checkpoints/step-3.pt.tmp": 4, "checkpoints/sharded/0.bin": 5,
             "checkpoints/sharded/1.bin": 6, "checkpoints/sharded-old/0.bin": 7, "log.txt": 1}
    assert claimed_files(CheckpointClaim(3, "step-3.pt"), found) == {"checkpoints/step-3.pt": 10}
    assert claimed_files(CheckpointClaim(3, "sharded"), found) == {"checkpoints/sharded/0.bin": 5,
                                                                   "checkpoints/sharded/1.bin": 6}
    with pytest.raises(ManifestError, match="step-4.pt, which is not in"):
        claimed_files(CheckpointClaim(4, "step-4.pt"), found)


def test_the_folder_and_the_resume_point_are_given_only_where_train_url_is_in_a_store_and_the_notice_where_asked():
    assert checkpoint_variables(False, "", 0, "USR1") == {}
    assert checkpoint_variables(False, "step-3.pt", 30, "USR2") == {"MA_CHECKPOINT_SIGNAL": "SIGUSR2",
                                                                     "MA_CHECKPOINT_GRACE": "30"}
    assert checkpoint_variables(True, "step-3.pt", 0, "USR1") == {
        "MA_CHECKPOINT_DIR": CHECKPOINT_DIR, "MA_RESUME_FROM": f"{CHECKPOINT_DIR}/step-3.pt"}


def plan_of(**values):
    node = SshTarget("node-a", "10.0.0.1", 22, "root", "key")
    workers = [WorkerValues(index=0, address="10.0.0.1", hostname="job-12-worker-0", node=node)]
    keys = KeyPair("private", "public")
    return plan_job(replace(job_values(), **values), workers, work_root="/srv/jobs", user="ma-user",
                    preferred_uid=1000, client_key=keys, host_key=keys)


def test_every_worker_of_a_resumed_attempt_gets_the_resume_point_and_the_plan_says_where_to_bring_it_from():
    plan = plan_of(parameters=(("train_url", "obs://user-1-a/run/"),), resume_from="step-3.pt",
                   resume_url="obs://user-1-a/run/checkpoints/step-3.pt", checkpoint_grace_seconds=20)
    env = plan.workers[0].env
    assert env["MA_CHECKPOINT_DIR"] == "/home/ma-user/modelarts/outputs/train_url_0/checkpoints"
    assert env["MA_RESUME_FROM"] == "/home/ma-user/modelarts/outputs/train_url_0/checkpoints/step-3.pt"
    assert (env["MA_CHECKPOINT_SIGNAL"], env["MA_CHECKPOINT_GRACE"]) == ("SIGUSR1", "20")
    assert plan.keeps_checkpoints and plan.resume_url.endswith("checkpoints/step-3.pt")
    assert plan.checkpoint_grace_seconds == 20

    local = plan_of(parameters=(("train_url", "/home/ma-user/out"),), resume_from="step-3.pt", resume_url="x")
    assert "MA_CHECKPOINT_DIR" not in local.workers[0].env and not local.resume_url and not local.keeps_checkpoints


def test_lost_work_runs_from_the_last_checkpoint_or_the_start_on_every_node_and_gpu():
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert lost_work(start, start + timedelta(minutes=10), start + timedelta(minutes=7), 2, 8) == \
        pytest.approx(type(lost_work(start, start, None, 1, 0))(180.0, 0.1, 0.8))
    assert lost_work(start, start + timedelta(hours=1), None, 3, 0).node_hours == pytest.approx(3.0)
    # A checkpoint of an earlier attempt (before this one started) saves this one nothing.
    assert lost_work(start, start + timedelta(minutes=1), start - timedelta(hours=1), 1, 0).seconds == 60.0


class FakeSync:
    """OutputSync's side of the SSH boundary: what a listing finds, what an upload sends."""

    def __init__(self, files: dict[str, int], uploads: bool = True):
        self.files, self.uploads = files, uploads
        self.target = SshTarget("worker-0", "10.0.0.1", 30000, "ma-user", "key")
        self.train_url = "obs://user-1-a/run/"
        self.found: dict[str, int] = {}
        self.sent: dict[str, tuple[int, int]] = {}
        self.failed: dict[str, str] = {}
        self.syncs = 0

    async def sync(self):
        await asyncio.sleep(0.01)  # an upload takes time: another look may come meanwhile
        self.syncs += 1
        self.found = dict(self.files)
        if self.uploads:
            self.sent = {path: (size, 1) for path, size in self.files.items()}


def watch_with(monkeypatch, manifest: str | None, sync: FakeSync):
    recorded, warned = [], []

    async def read(_target):
        return manifest

    async def record(found):
        recorded.append(found)

    async def warn(reason):
        warned.append(reason)

    monkeypatch.setattr(runtime_checkpoints, "read_manifest", read)
    return CheckpointWatch(sync, record, warn), recorded, warned  # type: ignore[arg-type]


def test_a_new_manifest_is_uploaded_at_once_and_recorded_once_its_files_are_in_the_store(monkeypatch):
    sync = FakeSync({"checkpoints/step-5.pt": 100, "checkpoints/checkpoint.json": 30})
    watch, recorded, warned = watch_with(monkeypatch, '{"step": 5, "path": "step-5.pt"}', sync)
    assert asyncio.run(watch.look()) is True
    assert [(found.claim.step, found.url, found.size_bytes) for found in recorded] == [
        (5, "obs://user-1-a/run/checkpoints/step-5.pt", 100)]
    # The same manifest again is not a new checkpoint, and costs no upload.
    assert asyncio.run(watch.look()) is False and sync.syncs == 1 and not warned


def test_two_looks_at_once_record_a_checkpoint_once(monkeypatch):
    sync = FakeSync({"checkpoints/step-5.pt": 100})
    watch, recorded, _ = watch_with(monkeypatch, '{"step": 5, "path": "step-5.pt"}', sync)

    async def both():
        return await asyncio.gather(watch.look(), watch.look())

    assert sorted(asyncio.run(both())) == [False, True]
    assert len(recorded) == 1 and watch.recorded_at is not None


def test_a_checkpoint_whose_upload_failed_is_not_recorded_until_it_is_in_the_store(monkeypatch):
    sync = FakeSync({"checkpoints/step-5.pt": 100}, uploads=False)
    watch, recorded, _ = watch_with(monkeypatch, '{"step": 5, "path": "step-5.pt"}', sync)
    assert asyncio.run(watch.look()) is False and not recorded
    sync.uploads = True
    assert asyncio.run(watch.look()) is True and len(recorded) == 1


@pytest.mark.parametrize(("manifest", "words"), [
    ('{"step": 5, "path": "step-6.pt"}', "names step-6.pt, which is not in"),
    ('{"step": 5, "path": "../secrets"}', "is not inside"),
    ("half a manif", "is not valid JSON"),
])
def test_a_manifest_naming_a_missing_file_or_a_place_outside_is_warned_of_once_and_never_recorded(
        monkeypatch, manifest, words):
    sync = FakeSync({"checkpoints/step-5.pt": 100})
    watch, recorded, warned = watch_with(monkeypatch, manifest, sync)
    assert asyncio.run(watch.look()) is False
    assert asyncio.run(watch.look()) is False
    assert not recorded and len(warned) == 1 and words in warned[0]


def test_no_manifest_is_no_checkpoint_and_no_warning(monkeypatch):
    watch, recorded, warned = watch_with(monkeypatch, None, FakeSync({}))
    assert asyncio.run(watch.look()) is False and not recorded and not warned


@pytest.mark.django_db
def test_a_checkpoint_after_the_notice_says_how_long_it_took_and_the_ended_attempt_counts_only_what_followed_it(make_job):
    job = make_job(status=JobStatus.RUNNING, started_at=timezone.now() - timedelta(minutes=10),
                   notice_sent_at=timezone.now() - timedelta(seconds=4))
    record_checkpoint(job.pk, CheckpointClaim(1200, "step-1200.pt"), "obs://b/run/checkpoints/step-1200.pt", 2048, 1)
    checkpoint = Checkpoint.objects.get(job=job)
    assert checkpoint.attempt == 1 and 3.5 < checkpoint.after_notice_seconds < 30
    assert JobEvent.objects.filter(job=job, kind="checkpoint", message__contains="step 1,200").exists()
    assert "s after the notice" in JobEvent.objects.get(job=job, kind="checkpoint").message

    for seq, step in enumerate((1199, 1200, 1215, 1230), 1):
        MetricPoint.objects.create(job=job, name="loss", rank=0, step=step, value=0.5, at=timezone.now(), seq=seq)
    attempt = close_attempt(job.pk, "stopped")
    assert attempt is not None and attempt.last_checkpoint_step == 1200 and attempt.lost_seconds < 30
    assert attempt.lost_steps == 30 and ", 30 steps" in lost_work_words(attempt)
    assert close_attempt(job.pk, "again") == attempt  # once an attempt
    assert "attempt 1 lost" in lost_work_words(attempt) and "step 1,200" in lost_work_words(attempt)


@pytest.mark.django_db
def test_an_attempt_without_a_checkpoint_lost_all_of_it(make_job):
    job = make_job(status=JobStatus.RUNNING, started_at=timezone.now() - timedelta(hours=1), node_count=2)
    attempt = close_attempt(job.pk, "failed")
    assert attempt is not None and attempt.last_checkpoint_step is None and attempt.lost_steps is None
    assert attempt.lost_node_hours == pytest.approx(2.0, rel=0.01)
    assert "no checkpoint" in lost_work_words(attempt)
    assert close_attempt(make_job(name="queued").pk, "never ran") is None
    assert Attempt.objects.count() == 1


@pytest.mark.django_db
def test_warnings_of_untrusted_manifests_are_kept_a_few_times_an_attempt(make_job):
    job = make_job(status=JobStatus.RUNNING)
    for _ in range(30):
        warn_checkpoint(job.pk, "checkpoint.json is not valid JSON")
    assert JobEvent.objects.filter(job=job, kind="checkpoint-ignored").count() == 20


@pytest.mark.django_db
def test_a_rebuild_resumes_from_the_newest_checkpoint_of_its_source_and_its_own_come_first_once_made(make_job,
                                                                                                       stranger):
    source = make_job(name="source")
    Checkpoint.objects.create(job=source, attempt=1, step=3, path="step-3.pt", url="obs://b/r/checkpoints/step-3.pt",
                              size_bytes=1, file_count=1, saved_at=timezone.now() - timedelta(minutes=5))
    rebuilt = make_job(name="rebuilt", resume_source=source, owner=source.owner)
    assert rebuilt.launch_values().resume_from == "step-3.pt"
    Checkpoint.objects.create(job=rebuilt, attempt=1, step=9, path="step-9.pt", url="obs://b/r/checkpoints/step-9.pt",
                              size_bytes=1, file_count=1, saved_at=timezone.now())
    assert rebuilt.launch_values().resume_url == "obs://b/r/checkpoints/step-9.pt"
    # Another user's job is never a resume point, whatever its id.
    strangers = make_job(name="strangers", resume_source=source, owner=stranger)
    assert strangers.launch_values().resume_from == ""


@pytest.mark.django_db
def test_the_form_refuses_a_notice_above_the_administrators_maximum_and_a_resume_from_a_job_without_checkpoints(
        make_job):
    from tests.unit.test_forms import page_post

    defaults = LauncherDefaults.current()
    defaults.checkpoint_grace_max_seconds = 60
    defaults.save()
    job = make_job()
    owner = job.owner
    from jobs.submission.forms import TrainingJobForm

    catalog = {"engine": job.engine_version, "spec": job.spec, "code_dir": job.code_dir}
    form = TrainingJobForm(page_post(catalog, checkpoint_grace_seconds="61", checkpoint_signal="KILL",
                                     resume_from_job=str(job.pk)), user=owner)
    assert not form.is_valid()
    assert form.errors["checkpoint_grace_seconds"] == ["The administrator allows at most 60 s of notice before a stop."]
    assert "checkpoint_signal" in form.errors
    assert form.errors["resume_from_job"] == [f"Job {job.pk} saved no checkpoint to resume from."]


@pytest.mark.django_db
def test_the_page_says_where_the_notice_was_refused_and_a_jobs_page_shows_its_checkpoints_and_lost_work(
        make_job, owner, tmp_path):
    from jobs.code_dirs.service import register
    from tests.unit.test_pages import browser_of

    (tmp_path / "train.py").write_text("")
    job = make_job(code_dir=register("mnist", tmp_path, sharing="everyone"), status=JobStatus.RUNNING,
                   started_at=timezone.now() - timedelta(minutes=5), owner=owner)
    pages = browser_of(owner)
    page = pages.post("/jobs/new", {
        "name": "noticed", "engine": job.engine_version.pk, "code_dir": job.code_dir.pk, "boot_file": "train.py",
        "spec": job.spec.pk, "node_count": "1", "checkpoint_grace_seconds": "100000"}).content.decode()
    assert "The administrator allows at most 600 s of notice before a stop." in page
    assert re.search(r'id="id_checkpoint_grace_seconds"[^>]*value="100000"', page), "what was typed is kept"

    # Another job's checkpoint first, so that this job's checkpoint and this job have different ids.
    other = make_job(name="other", owner=owner)
    for step in range(3):
        record_checkpoint(other.pk, CheckpointClaim(step, f"s-{step}"), "obs://b/o/checkpoints/s", 1, 1)
    record_checkpoint(job.pk, CheckpointClaim(40, "step-40.npz"), "obs://b/r/checkpoints/step-40.npz", 4096, 1)
    assert Checkpoint.objects.get(job=job).pk != job.pk
    warn_checkpoint(job.pk, "checkpoint.json: path '../x' is not inside the folder")
    close_attempt(job.pk, "stopped")
    shown = pages.get(f"/jobs/{job.pk}").content.decode()
    assert 'data-step="40"' in shown and "step-40.npz" in shown
    assert "attempt 1 lost" in shown and "since its checkpoint at step 40" in shown
    assert "is not inside the folder" in shown
    rebuild = pages.get(f"/jobs/{job.pk}/rebuild").content.decode()
    assert f'name="resume_from_job" value="{job.pk}"' in rebuild


@pytest.mark.django_db
def test_an_administrator_reads_the_lost_work_summed_by_user_and_by_pool_and_cannot_edit_it(make_job, stranger):
    from django.test import Client

    from tests.fixtures import person

    for owner, minutes in ((None, 60), (stranger, 30)):
        job = make_job(status=JobStatus.RUNNING, started_at=timezone.now() - timedelta(minutes=minutes), node_count=2,
                       **({"owner": owner} if owner else {}))
        close_attempt(job.pk, "failed")
    client = Client()
    client.force_login(person("root-admin", is_staff=True, is_superuser=True))
    page = client.get("/admin/jobs/attempt/").content.decode()
    assert "Lost work by user" in page and "Lost work by pool" in page
    assert re.search(r"<td>owner</td><td>1</td><td>2\.0\d</td>", page), page
    assert re.search(r"<td>stranger</td><td>1</td><td>1\.0\d</td>", page)
    attempt = Attempt.objects.first()
    assert client.post(f"/admin/jobs/attempt/{attempt.pk}/change/", {"lost_seconds": 0}).status_code == 403


@pytest.mark.django_db
def test_a_completed_attempt_lost_nothing(make_job):
    job = make_job(status=JobStatus.RUNNING, started_at=timezone.now() - timedelta(hours=2))
    attempt = close_attempt(job.pk, "exit status 0", completed=True)
    assert attempt is not None and (attempt.lost_seconds, attempt.lost_node_hours, attempt.lost_steps) == (0.0, 0.0, 0)


@pytest.mark.django_db
def test_a_rebuild_of_a_rebuild_that_saved_nothing_resumes_from_the_first_ones_checkpoint(make_job):
    first = make_job(name="first")
    Checkpoint.objects.create(job=first, attempt=1, step=7, path="step-7.pt", url="obs://b/r/checkpoints/step-7.pt",
                              size_bytes=1, file_count=1, saved_at=timezone.now())
    second = make_job(name="second", resume_source=first, owner=first.owner)
    third = make_job(name="third", resume_source=second, owner=first.owner)
    assert third.launch_values().resume_from == "step-7.pt"
    # A loop of sources (never made by the console, but not trusted either) ends.
    first.resume_source = third
    first.save(update_fields=["resume_source"])
    assert third.launch_values().resume_from == "step-7.pt"


@pytest.mark.django_db
def test_a_job_keeps_its_newest_checkpoints_and_its_detail_holds_a_few_while_the_api_pages_through_the_rest(
        make_job, client, settings):
    from jobs.models import CHECKPOINTS_IN_DETAIL, ApiToken

    settings.CHECKPOINTS_KEPT = 30
    job = make_job(status=JobStatus.RUNNING, started_at=timezone.now())
    for step in range(1, 36):
        record_checkpoint(job.pk, CheckpointClaim(step, f"step-{step}.pt"), f"obs://b/c/step-{step}.pt", 10, 1)
    kept = list(Checkpoint.objects.filter(job=job).values_list("step", flat=True))
    assert kept == list(range(35, 5, -1)), "the newest 30, newest first"
    assert job.resume_checkpoint().step == 35

    headers = {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(job.owner, 'checkpoints')[1]}"}
    detail = client.get(f"/api/v1/training-jobs/{job.pk}", **headers).json()
    assert [each["step"] for each in detail["checkpoints"]] == list(range(35, 35 - CHECKPOINTS_IN_DETAIL, -1))
    assert detail["checkpoint_count"] == 30
    first = client.get(f"/api/v1/training-jobs/{job.pk}/checkpoints?limit=25", **headers).json()
    rest = client.get(first["next"], **headers).json()
    assert first["count"] == 30 and [each["step"] for each in first["results"] + rest["results"]] == kept
    client.force_login(job.owner)
    page = client.get(f"/jobs/{job.pk}").content.decode()
    assert 'data-checkpoint-total="30"' in page and f"/api/v1/training-jobs/{job.pk}/checkpoints" in page


@pytest.mark.parametrize(("ends_in", "grace"), [
    (None, 120),  # no bound: the job's whole grace
    (300, 120),   # the nodes are taken back after the grace and the teardown
    (60, 50),     # before: the grace is cut so that the teardown still fits
    (8, 0),       # too late for any notice
])
def test_a_notices_grace_is_cut_short_where_the_nodes_are_taken_back_before_it_ends(ends_in, grace):
    sent = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    ends_by = None if ends_in is None else sent + timedelta(seconds=ends_in)
    assert notice_grace(120, sent, ends_by, teardown_seconds=10) == grace


@pytest.mark.django_db
def test_a_notice_is_claimed_once_an_attempt_and_not_at_all_when_the_nodes_are_taken_back_too_soon(make_job):
    from jobs.models import TrainingJob
    from jobs.results.checkpoints import claim_notice

    job = make_job(status=JobStatus.TERMINATING)
    TrainingJob.objects.filter(pk=job.pk).update(notice_ends_by=timezone.now() + timedelta(seconds=8))
    too_soon = claim_notice(job.pk, 20, 10)
    assert (too_soon.ours, too_soon.grace) == (False, 0)
    assert TrainingJob.objects.get(pk=job.pk).notice_sent_at is None  # no checkpoint is said to answer a notice

    TrainingJob.objects.filter(pk=job.pk).update(notice_ends_by=timezone.now() + timedelta(seconds=25))
    first = claim_notice(job.pk, 20, 10)
    assert first.ours and 14 <= first.grace <= 15
    again = claim_notice(job.pk, 20, 10)  # another process, taking the run up
    assert (again.ours, again.sent_at, again.grace) == (False, first.sent_at, first.grace)


@pytest.mark.django_db
def test_a_completed_attempt_lost_nothing_and_a_job_without_an_object_store_output_is_not_told_of_a_checkpoint_folder(
        make_job, client):
    job = make_job(status=JobStatus.RUNNING, started_at=timezone.now() - timedelta(minutes=10), checkpoint_grace_seconds=30,
                   parameters=[{"name": "train_url", "value": "/home/ma-user/outputs"}])
    attempt = close_attempt(job.pk, "exit status 0", completed=True)
    assert attempt is not None and lost_work_words(attempt) == "attempt 1 lost nothing"

    client.force_login(job.owner)
    page = client.get(f"/jobs/{job.pk}").content.decode()
    assert "$MA_CHECKPOINT_DIR" not in page
    assert "Its train_url is not in an object store: the program is given no checkpoint folder" in page
