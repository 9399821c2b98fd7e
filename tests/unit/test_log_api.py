"""The log endpoints: pages and tail, downloads per worker, first error, live events with resume, the NCCL panel."""

import json
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.core.cache import cache
from django.test import AsyncClient
from rest_framework.test import APIClient

from jobs.logs.store import LogRecord
from jobs.models import ApiToken, JobStatus, LogStream, TrainingJob
from nccl.parser import parse_nccl_file
from tests.unit.log_helpers import quiet_redis, rank_line, store, system_line  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet_redis")]
NCCL_LOGS = sorted((Path(__file__).resolve().parents[1] / "data" / "nccl-logs").glob("*.log"))


@pytest.fixture
def stranger_api(stranger):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {ApiToken.issue(stranger, 'test')[1]}")
    return client


@pytest.fixture
def job(make_job, owner):
    job = make_job(owner=owner, name="probe")
    store(job, [
        system_line("Preparing 2 worker(s)"),
        system_line("worker-1: starting sshd", worker=1),
        rank_line(0, "hello from 0"),
        rank_line(2, "hello from 2"),
        rank_line(3, "Traceback (most recent call last):", LogStream.STDERR),
        LogRecord(text="mpirun detected that one or more processes exited with non-zero status",
                  stream=LogStream.STDERR, worker_index=0),
        system_line("Training end with return code: 1"),
    ])
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.FAILED)
    job.refresh_from_db()
    return job


def test_the_tail_then_older_pages_then_following_cover_the_log(api, job):
    tail = api.get(f"/api/v1/training-jobs/{job.pk}/log/lines", {"tail": 1, "limit": 3}).json()
    assert [line["seq"] for line in tail["lines"]] == [5, 6, 7]
    assert tail["next"] == 7 and tail["previous"] == 5 and tail["capped"] is False
    older = api.get(f"/api/v1/training-jobs/{job.pk}/log/lines", {"before": tail["previous"], "limit": 3}).json()
    assert [line["seq"] for line in older["lines"]] == [2, 3, 4] and older["previous"] == 2
    following = api.get(f"/api/v1/training-jobs/{job.pk}/log/lines", {"after": 5, "worker": 1}).json()
    assert [line["text"] for line in following["lines"]] == ["Training end with return code: 1"]
    assert following["next"] == 7 and following["more"] is False


def test_asking_for_after_and_before_together_is_refused_naming_the_problem(api, job):
    response = api.get(f"/api/v1/training-jobs/{job.pk}/log/lines", {"after": 1, "before": 3})
    assert response.status_code == 400
    assert "after, before" in json.dumps(response.json())


def test_a_workers_download_is_named_like_the_reference_and_holds_its_lines_and_the_platforms(api, job):
    response = api.get(f"/api/v1/training-jobs/{job.pk}/log/download", {"worker": 1})
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="{job.dns_name}-worker-1.log"'
    body = b"".join(response.streaming_content).decode()
    assert body.splitlines() == [
        "[ModelArts Service Log]Preparing 2 worker(s)",
        "[ModelArts Service Log]worker-1: starting sshd",
        "[rank 2] hello from 2",
        "[rank 3] Traceback (most recent call last):",
        "[ModelArts Service Log]Training end with return code: 1",
    ]
    whole = api.get(f"/api/v1/training-jobs/{job.pk}/log/download")
    assert whole["Content-Disposition"] == f'attachment; filename="{job.dns_name}.log"'
    assert len(b"".join(whole.streaming_content).decode().splitlines()) == 7


def test_a_stranger_can_neither_download_nor_follow_the_owners_log(stranger_api, job):
    assert stranger_api.get(f"/api/v1/training-jobs/{job.pk}/log/download").status_code == 404
    assert stranger_api.get(f"/api/v1/training-jobs/{job.pk}/log/events").status_code == 404
    assert stranger_api.get(f"/api/v1/training-jobs/{job.pk}/nccl").status_code == 404


def test_jump_to_first_error_lands_on_the_traceback_then_on_mpiruns_complaint(api, job):
    first = api.get(f"/api/v1/training-jobs/{job.pk}/log/first-error").json()
    assert first["seq"] == 5 and first["line"]["rank"] == 3
    assert api.get(f"/api/v1/training-jobs/{job.pk}/log/first-error", {"after": 5}).json()["seq"] == 6
    assert api.get(f"/api/v1/training-jobs/{job.pk}/log/first-error", {"rank": 0}).json() == {"seq": None, "line": None}


def read_events(path: str, token: str | None, **headers) -> tuple[int, list[dict]]:
    """Every event of a stream that ends (the job is over), as dicts with id, event and data."""

    async def read():
        extra = {"Authorization": f"Token {token}"} if token else {}
        response = await AsyncClient().get(path, headers={**extra, **headers})
        if response.status_code != 200:
            return response.status_code, []
        body = b""
        async for chunk in response.streaming_content:
            body += chunk
        return 200, [parse_event(block) for block in body.decode().split("\n\n") if block.strip()]

    return async_to_sync(read)()


def parse_event(block: str) -> dict:
    event = {}
    for line in block.splitlines():
        name, _, value = line.partition(": ")
        event[name] = json.loads(value) if name == "data" else value
    return event


def test_live_events_carry_every_line_with_its_number_and_end_when_the_job_is_over(token, job):
    status, events = read_events(f"/api/v1/training-jobs/{job.pk}/log/events", token)
    assert status == 200
    lines = [event for event in events if "data" in event and "event" not in event]
    assert [int(event["id"]) for event in lines] == list(range(1, 8))
    assert [event["data"]["seq"] for event in lines] == list(range(1, 8))
    assert events[-1]["event"] == "end" and events[-1]["data"] == {"status": "Failed", "next": 7}


def test_a_reconnecting_follower_resumes_after_its_last_event_id_without_repeats(token, job):
    _status, events = read_events(f"/api/v1/training-jobs/{job.pk}/log", token,
                                  Accept="text/event-stream", **{"Last-Event-ID": "4"})
    assert [event["data"]["seq"] for event in events if "id" in event and "event" not in event] == [5, 6, 7]


def test_a_filtered_follower_is_told_where_its_cursor_went_past_lines_it_did_not_want(token, job):
    _status, events = read_events(f"/api/v1/training-jobs/{job.pk}/log/events?rank=2&system=0", token)
    assert [event["data"]["text"] for event in events if "event" not in event and "data" in event] == ["hello from 2"]
    cursor = [event for event in events if event.get("event") == "cursor"]
    assert cursor and cursor[-1]["id"] == "7"


def test_following_without_credentials_is_refused_and_a_bad_last_event_id_is_named(token, job):
    assert read_events(f"/api/v1/training-jobs/{job.pk}/log/events", None)[0] == 401
    assert read_events(f"/api/v1/training-jobs/{job.pk}/log/events", token, **{"Last-Event-ID": "x"})[0] == 400


def test_the_plain_text_log_still_pages_by_offset(api, job):
    response = api.get(f"/api/v1/training-jobs/{job.pk}/log", {"offset": 5})
    assert response["X-Next-Offset"] == "7"
    assert response.content.decode().splitlines()[0] == "[mpirun] mpirun detected that one or more processes exited with non-zero status"


def store_file_as_log(job, path: Path) -> None:
    with open(path, encoding="utf-8", errors="replace", newline=None) as handle:
        store(job, [LogRecord(text=line.rstrip("\r\n"), worker_index=0) for line in handle])


@pytest.mark.parametrize("path", NCCL_LOGS, ids=lambda path: path.name[:2])
def test_the_panel_reads_only_nccl_lines_yet_finds_what_the_parser_finds_in_the_whole_file(make_job, api, owner, path):
    cache.clear()
    job = make_job(owner=owner, name=f"nccl-{path.name[:2]}", network="ib")
    store(job, [rank_line(0, "unrelated training output")] * 3)
    store_file_as_log(job, path)
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)

    report = api.get(f"/api/v1/training-jobs/{job.pk}/nccl").json()
    whole = parse_nccl_file(path).to_dict()
    ignore = {"line_count"}
    assert {k: v for k, v in report["summary"].items() if k not in ignore} == {
        k: v for k, v in whole.items() if k not in ignore}
    assert report["final"] is True and report["log_lines"] == job.log_lines.count()


def test_the_panel_says_a_job_on_an_infiniband_spec_fell_back_to_sockets(make_job, api, owner):
    job = make_job(owner=owner, name="fallback", network="ib")
    store_file_as_log(job, next(path for path in NCCL_LOGS if path.name.startswith("22-")))
    report = api.get(f"/api/v1/training-jobs/{job.pk}/nccl").json()
    assert report["seen"] and report["final"] is False
    assert report["summary"]["net"] == "Socket"
    assert "socket-fallback" in [finding["code"] for finding in report["diagnosis"]]
    assert report["expected"] == {"network": "ib", "nodes": 2, "ranks": 4,
                                  "workers": [f"{job.dns_name}-worker-0", f"{job.dns_name}-worker-1"]}


def test_while_a_job_runs_the_panel_reads_only_new_lines_and_a_finished_one_comes_from_the_cache(make_job, api, owner, django_assert_max_num_queries):
    cache.clear()
    job = make_job(owner=owner, name="growing", network="socket")
    store(job, [rank_line(0, "host-a:11:11 [0] NCCL INFO NCCL version 2.18.1+cuda12.1")])
    first = api.get(f"/api/v1/training-jobs/{job.pk}/nccl").json()
    assert first["summary"]["version"] == "2.18.1"
    store(job, [rank_line(1, "host-b:12:12 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>")])
    second = api.get(f"/api/v1/training-jobs/{job.pk}/nccl").json()
    assert second["summary"]["version"] == "2.18.1" and second["summary"]["net"] == "Socket"
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)
    api.get(f"/api/v1/training-jobs/{job.pk}/nccl")
    with django_assert_max_num_queries(4):  # auth, the user's permissions, the job; no log lines
        assert api.get(f"/api/v1/training-jobs/{job.pk}/nccl").json()["final"] is True


def test_the_job_page_carries_the_nccl_panel_pointing_at_its_api(client, owner, job):
    client.force_login(owner)
    page = client.get(f"/jobs/{job.pk}").content.decode()
    assert f'data-nccl-url="/api/v1/training-jobs/{job.pk}/nccl"' in page
    assert "jobs/nccl_panel.js" in page


def test_the_download_streams_the_same_file_through_the_asgi_server(token, job):
    async def download():
        response = await AsyncClient().get(f"/api/v1/training-jobs/{job.pk}/log/download?worker=0",
                                           headers={"Authorization": f"Token {token}"})
        assert response.is_async
        return b"".join([chunk async for chunk in response.streaming_content]).decode()

    assert async_to_sync(download)().splitlines() == [
        "[ModelArts Service Log]Preparing 2 worker(s)",
        "[rank 0] hello from 0",
        "[mpirun] mpirun detected that one or more processes exited with non-zero status",
        "[ModelArts Service Log]Training end with return code: 1",
    ]


def test_each_line_event_is_written_as_json_dumps_writes_its_payload(make_job):
    from jobs.logs.follow import _event, _line_events, line_payload
    from jobs.logs.store import read_after

    job = make_job()
    texts = ['quote " backslash \\ tab \t', "control \x01 \x1b[31m DEL \x7f", "é 中文 \u2028 \U0001f600", "", "[rank 3] x"]
    store(job, [rank_line(number % 4, text) for number, text in enumerate(texts)]
          + [system_line("Training end", worker=None), LogRecord(text="mpirun's own", stream=LogStream.STDERR)])
    lines = read_after(job.pk, 0, {}, 100).lines
    assert _line_events(lines) == [_event(None, line_payload(line), line.seq) for line in lines]
    assert [json.loads(event.split("data: ", 1)[1])["text"] for event in _line_events(lines)][:5] == texts


def test_a_reader_counts_the_matches_of_a_pattern_and_a_level_in_the_whole_log(api, stranger_api, job):
    url = f"/api/v1/training-jobs/{job.pk}/log/matches"
    assert api.get(url, {"q": "HELLO"}).json() == {"count": 2, "next": None, "through": 7}
    assert api.get(url, {"q": r"hello from [02]$", "regex": "1"}).json()["count"] == 2
    assert api.get(url, {"q": r"(?i)HELLO from 2", "regex": "1"}).json()["count"] == 1
    assert api.get(url, {"level": "error"}).json()["count"] == 3  # the traceback, mpirun's words, return code 1
    assert api.get(url, {"level": "error", "worker": 1}).json()["count"] == 2  # rank 3's traceback, the end line
    assert api.get(url, {"q": "hello", "through": 3}).json() == {"count": 1, "next": None, "through": 3}
    # The text as typed, its spaces too: "from 0 " is not in "hello from 0".
    assert (api.get(url, {"q": "from 0"}).json()["count"], api.get(url, {"q": "from 0 "}).json()["count"]) == (1, 0)
    assert stranger_api.get(url, {"q": "hello"}).status_code == 404


def test_a_pattern_the_search_cannot_run_or_an_unknown_level_is_named_not_served(api, job):
    for path in ("matches", "lines", "first-error", "download"):
        answer = api.get(f"/api/v1/training-jobs/{job.pk}/log/{path}", {"q": "(x)\\1", "regex": "true"})
        assert answer.status_code == 400 and "RE2" in answer.json()["q"][0]
    answer = api.get(f"/api/v1/training-jobs/{job.pk}/log/lines", {"level": "debug", "tail": "1"})
    assert answer.status_code == 400 and list(answer.json()) == ["level"]
    for through in ("-3", "²", "9" * 5000):
        answer = api.get(f"/api/v1/training-jobs/{job.pk}/log/matches", {"through": through})
        assert answer.status_code == 400 and list(answer.json()) == ["through"]


def test_the_tail_of_a_search_holds_only_matching_lines_by_pattern_and_level(api, job):
    answer = api.get(f"/api/v1/training-jobs/{job.pk}/log/lines", {"tail": "1", "level": "error"}).json()
    assert [line["seq"] for line in answer["lines"]] == [5, 6, 7] and answer["previous"] is None
    answer = api.get(f"/api/v1/training-jobs/{job.pk}/log/lines", {"tail": "1", "q": "^hello", "regex": "on"}).json()
    assert [line["text"] for line in answer["lines"]] == ["hello from 0", "hello from 2"]
