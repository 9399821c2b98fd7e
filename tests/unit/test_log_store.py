"""The log store: gapless numbering, the cap, filters done by the database, cursors that neither skip nor repeat."""

import re

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from jobs.logs.forms import LogQueryForm
from jobs.logs.search import count_matches, search_before
from jobs.logs.store import (
    SCAN_WINDOW,
    SERVICE_LOG_PREFIX,
    LogRecord,
    RunTakenOver,
    first_error,
    read_after,
    read_before,
    render_text,
    store_lines,
)
from jobs.models import LauncherDefaults, LogLine, LogStream, TrainingJob
from tests.unit.log_helpers import quiet_redis, rank_line, store, system_line  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet_redis")]


def texts(job):
    return list(job.log_lines.order_by("seq").values_list("text", flat=True))


def test_lines_of_several_batches_are_numbered_one_to_n_in_order(make_job):
    job = make_job()
    store(job, [rank_line(0, "a"), rank_line(1, "b")])
    store(job, [system_line("c")])
    assert store(job, [rank_line(3, "d")]) == 4
    assert list(job.log_lines.order_by("seq").values_list("seq", "text")) == [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    job.refresh_from_db()
    assert job.log_line_count == 4


def test_the_cap_stops_the_output_with_one_note_while_platform_lines_are_still_stored(make_job):
    job = make_job(log_cap_bytes=10)
    first = store_lines(job.pk, [rank_line(0, "1234"), rank_line(0, "5678")])  # 5 + 5 bytes with newlines
    assert not first.capped
    second = store_lines(job.pk, [rank_line(0, "over"), system_line("Training end with return code: 0"), rank_line(1, "more")])
    assert second.capped
    third = store_lines(job.pk, [rank_line(0, "still dropped"), system_line("worker-0: container removed")],
                        dropped_before=5)
    assert third.capped

    lines = list(job.log_lines.order_by("seq"))
    assert [line.text for line in lines][:2] == ["1234", "5678"]
    notes = [line for line in lines if line.text.startswith("Log cap reached")]
    assert len(notes) == 1 and notes[0].stream == LogStream.SYSTEM and notes[0].seq == 3
    assert "10 bytes" in notes[0].text and "keeps running" in notes[0].text
    assert [line.text for line in lines[3:]] == ["Training end with return code: 0", "worker-0: container removed"]
    job.refresh_from_db()
    assert job.log_lines_dropped == 1 + 1 + 1 + 5
    assert job.log_bytes == 10
    assert list(job.log_lines.values_list("seq", flat=True).order_by("seq")) == list(range(1, 6))


def test_a_job_without_its_own_cap_takes_the_admin_setting_when_its_log_starts(make_job):
    defaults = LauncherDefaults.current()
    defaults.log_cap_bytes = 6
    defaults.save()
    job = make_job()
    assert store_lines(job.pk, [rank_line(0, "12345"), rank_line(0, "x")]).capped
    job.refresh_from_db()
    assert job.log_cap_bytes == 6
    defaults.log_cap_bytes = 10**9
    defaults.save()
    assert store_lines(job.pk, [rank_line(0, "y")]).capped, "a job keeps the cap it started with"


def test_a_cap_of_zero_stores_everything(make_job):
    job = make_job(log_cap_bytes=0)
    assert not store_lines(job.pk, [rank_line(0, "x" * 1000)] * 50).capped
    assert job.log_lines.count() == 50


def test_a_line_over_the_size_limit_is_stored_cut_and_marked(make_job, settings):
    settings.LOG_LINE_MAX_BYTES = 256
    job = make_job()
    store(job, [rank_line(0, "é" * 1000)])
    text = texts(job)[0]
    assert text.endswith(" …[line cut]") and len(text.encode()) <= 256 + len(" …[line cut]".encode())


# A small log with every kind of line: two workers of two ranks, both streams, platform lines of the job
# and of one worker, and mpirun's own words (worker-0, no rank).
MIXED_LOG = [
    system_line("Preparing 2 worker(s)"),
    system_line("worker-1: uploading code", worker=1),
    rank_line(0, "step 1 loss=0.5"),
    rank_line(1, "step 1 Loss=0.4", LogStream.STDERR),
    rank_line(2, "NCCL INFO Using network Socket"),
    rank_line(3, "Traceback (most recent call last):", LogStream.STDERR),
    LogRecord(text="mpirun noticed that process rank 3 exited on signal 9", stream=LogStream.STDERR, worker_index=0),
    rank_line(2, "error rate 0.1"),
    rank_line(1, "UserWarning: the lr scheduler was stepped before the optimizer", LogStream.STDERR),
    rank_line(0, "W1204 12:00:01 WARN slow step"),
    system_line("Training end with return code: 137"),
] * 7


def reference_filter(line: LogLine, query: dict) -> bool:
    """What each filter means, said in Python; the store must do the same in SQL."""
    if query.get("worker") is not None:
        own = line.worker_index == query["worker"]
        job_wide_platform = line.worker_index is None and line.stream == LogStream.SYSTEM
        if not (own or job_wide_platform):
            return False
    if query.get("rank") is not None and line.rank != query["rank"]:
        return False
    if query.get("stream") and line.stream != query["stream"]:
        return False
    if not query.get("system", True) and line.stream == LogStream.SYSTEM:
        return False
    if query.get("level") == "error" and not ERROR_WORDS.search(line.text):
        return False
    if query.get("level") == "warning" and not (ERROR_WORDS.search(line.text) or WARNING_WORDS.search(line.text)):
        return False
    if query.get("regex"):
        return not query.get("q") or re.search(query["q"], line.text) is not None
    return not query.get("q") or query["q"].lower() in line.text.lower()


# The levels, said again here for the few kinds of line MIXED_LOG holds.
ERROR_WORDS = re.compile(r"Traceback|exited on signal|return code: [1-9]")
WARNING_WORDS = re.compile(r"Warning|WARN")


queries = st.fixed_dictionaries({
    "worker": st.sampled_from([None, 0, 1, 2]),
    "rank": st.sampled_from([None, 0, 2, 3]),
    "stream": st.sampled_from(["", "stdout", "stderr", "system"]),
    "system": st.booleans(),
    "q": st.sampled_from(["", "loss", "LOSS", "worker-1", "nccl", "zzz", "(?i)loss=0\\.[45]", "^step \\d", "rank [0-9]"]),
    "regex": st.booleans(),
    "level": st.sampled_from(["", "", "warning", "error"]),
})


@pytest.fixture
def mixed_job(make_job):
    job = make_job()
    store(job, MIXED_LOG)
    return job


@hypothesis_settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=queries, limit=st.integers(1, 12), window=st.integers(1, 40))
@example(query={"worker": 1, "rank": None, "stream": "", "system": True, "q": ""}, limit=3, window=5)
@example(query={"worker": 0, "rank": None, "stream": "stderr", "system": True, "q": ""}, limit=2, window=7)
@example(query={"worker": None, "rank": None, "stream": "", "system": False, "q": "LOSS"}, limit=1, window=1)
@example(query={"worker": None, "rank": None, "stream": "", "system": True, "q": "^step \\d", "regex": True,
                "level": ""}, limit=1, window=3)
@example(query={"worker": 1, "rank": None, "stream": "", "system": True, "q": "", "regex": False,
                "level": "warning"}, limit=2, window=4)
def test_following_with_any_filter_and_page_size_returns_each_matching_line_once_in_order(mixed_job, query, limit, window):
    expected = [line.seq for line in mixed_job.log_lines.order_by("seq") if reference_filter(line, query)]
    seen, cursor, more = [], 0, True
    for _ in range(500):
        page = read_after(mixed_job.pk, cursor, query, limit, window=window)
        assert page.next >= cursor
        seen += [line.seq for line in page.lines]
        cursor, more = page.next, page.more
        if not more:
            break
    assert seen == expected
    assert cursor == len(MIXED_LOG)


@hypothesis_settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=queries, limit=st.integers(1, 12), window=st.integers(1, 40))
def test_reading_back_from_the_tail_reaches_the_start_with_each_matching_line_once(mixed_job, query, limit, window):
    expected = [line.seq for line in mixed_job.log_lines.order_by("seq") if reference_filter(line, query)]
    pages, before = [], len(MIXED_LOG) + 1
    for _ in range(500):
        page = read_before(mixed_job.pk, before, query, limit, window=window)
        assert all(line.seq < before for line in page.lines)
        pages.insert(0, [line.seq for line in page.lines])
        if page.previous is None:
            break
        before = page.previous
    assert [seq for page in pages for seq in page] == expected


def test_a_follower_never_passes_a_line_that_is_not_stored_yet(mixed_job):
    page = read_after(mixed_job.pk, 0, {}, 1000, total=5)
    assert [line.seq for line in page.lines] == [1, 2, 3, 4, 5] and page.next == 5 and not page.more


def test_a_sparse_filter_over_a_long_log_answers_in_bounded_steps(make_job):
    job = make_job()
    store(job, [rank_line(0, "x")] * (SCAN_WINDOW + 10) + [rank_line(3, "needle")])
    page = read_after(job.pk, 0, {"rank": 3}, 100)
    assert page.lines == [] and page.next == SCAN_WINDOW and page.more
    page = read_after(job.pk, page.next, {"rank": 3}, 100)
    assert [line.text for line in page.lines] == ["needle"] and not page.more


@pytest.mark.parametrize(("text", "error"), [
    ("train.py: error: argument --steps: invalid int value: 'abc'", True),
    ("error: the input folder is empty", True),
    ("gcc: fatal error: no input files", True),
    ("step=3 error: 0.25 rel_error: 0.1", False),  # a metric named error, mid-line
    ("mean_error=0.3", False),
])
def test_a_programs_own_error_line_is_an_error_and_a_metric_named_error_is_not(text, error):
    from jobs.logs.matching import looks_like_error

    assert looks_like_error(text) is error


def test_the_first_error_is_a_traceback_or_warning_or_failed_exit_and_not_a_lowercase_metric(make_job):
    job = make_job()
    store(job, [
        rank_line(0, "error rate 0.1"),
        rank_line(0, "no errors so far"),
        system_line("Training end with return code: 0"),
        rank_line(1, "host:12:13 [0] NCCL INFO Using network Socket"),
        rank_line(1, "host:12:13 [0] misc/socket.cc:1 NCCL WARN Net : Connect to 10.0.0.2 failed"),
        rank_line(2, "Traceback (most recent call last):"),
        rank_line(2, "RuntimeError: boom"),
        system_line("Training end with return code: 1"),
    ])
    assert first_error(job.pk, {}).seq == 5
    assert first_error(job.pk, {}, after=5).seq == 6
    assert first_error(job.pk, {"rank": 2}).text == "Traceback (most recent call last):"
    assert first_error(job.pk, {"stream": "system"}).seq == 8
    assert first_error(job.pk, {}, after=8) is None


def test_lines_of_a_process_that_no_longer_owns_the_run_are_refused_with_their_cursor(make_job):
    job = make_job()
    TrainingJob.objects.filter(pk=job.pk).update(run_owner="new:2:cd", launch_cursor={"stdout": {"offset": 10}})

    with pytest.raises(RunTakenOver):
        store_lines(job.pk, [rank_line(0, "late")], launch_cursor={"stdout": {"offset": 99}}, owner="old:1:ab")

    job.refresh_from_db()
    assert job.log_line_count == 0 and job.launch_cursor == {"stdout": {"offset": 10}}
    store_lines(job.pk, [rank_line(0, "mine")], launch_cursor={"stdout": {"offset": 20}}, owner="new:2:cd")
    job.refresh_from_db()
    assert job.log_line_count == 1 and job.launch_cursor == {"stdout": {"offset": 20}}


def test_a_nul_in_a_programs_output_is_stored_as_a_replacement_character(make_job):
    job = make_job()
    store_lines(job.pk, [rank_line(0, "a\x00b")])
    assert LogLine.objects.get(job=job).text == "a\ufffdb"


@pytest.mark.parametrize("stream", [LogStream.STDOUT, LogStream.STDERR])
@pytest.mark.parametrize("rank", [None, 0, 3])
def test_a_job_line_that_imitates_the_platforms_mark_never_reads_as_one(stream, rank):
    imitation = f"{SERVICE_LOG_PREFIX}Training end with return code: 0"
    rendered = render_text(stream, rank, imitation)
    assert not rendered.startswith(SERVICE_LOG_PREFIX)
    assert rendered.startswith("[mpirun] " if rank is None else f"[rank {rank}] ")
    assert render_text(LogStream.SYSTEM, None, "Preparing").startswith(SERVICE_LOG_PREFIX)


def test_lines_read_as_values_hold_what_the_models_hold_times_included(make_job):
    from datetime import UTC, datetime, timedelta

    job = make_job()
    start = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
    times = [start, start, start + timedelta(microseconds=1), start + timedelta(seconds=1), start]
    store(job, [LogRecord(text=f"line {number}", rank=number % 2, worker_index=0, at=at) for number, at in enumerate(times)])
    page = read_after(job.pk, 0, {}, 100)
    models = list(job.log_lines.order_by("seq"))
    assert [(line.seq, line.worker_index, line.rank, line.stream, line.text, line.at) for line in page.lines] == [
        (line.seq, line.worker_index, line.rank, line.stream, line.text, line.at) for line in models]
    assert [line.at for line in page.lines] == times


def test_a_search_reads_back_through_the_whole_log_for_a_line_near_its_start(make_job):
    job = make_job()
    store(job, [rank_line(0, "x")] * 3 + [rank_line(1, "the needle")] + [rank_line(0, "x")] * 200)
    # Each stretch the store looks at is 10 lines; the search goes on, stretch after stretch, to line 4.
    page = search_before(job.pk, 205, {"q": "NEEDLE"}, 500, total=204, window=10)
    assert [(line.seq, line.text) for line in page.lines] == [(4, "the needle")]
    assert page.previous is None  # the start was reached: no other line matches


def test_a_search_out_of_time_says_where_it_stopped_instead_of_no_match(make_job):
    job = make_job()
    store(job, [rank_line(1, "the needle")] + [rank_line(0, "x")] * 100)
    page = search_before(job.pk, 102, {"q": "needle"}, 500, total=101, window=10, seconds=0)
    assert page.lines == [] and page.previous == 92
    page = search_before(job.pk, page.previous, {"q": "needle"}, 500, total=101, window=100)
    assert [line.seq for line in page.lines] == [1] and page.previous is None


def test_matches_are_counted_in_the_database_or_line_by_line_in_steps_that_add_up(make_job, monkeypatch):
    job = make_job()
    store(job, MIXED_LOG)
    every = {"worker": None, "rank": None, "stream": "", "system": True}
    for query in ({"q": "loss"}, {"q": "(?i)^step 1 loss", "regex": True}, {"level": "error"}, {"level": "warning"}):
        expected = sum(1 for line in job.log_lines.all() if reference_filter(line, {**every, **query}))
        assert expected > 0
        assert count_matches(job.pk, query, after=0, through=len(MIXED_LOG)).count == expected
        # Line by line, a few lines a step and out of time after each: the steps say where to go on.
        monkeypatch.setattr("jobs.logs.search.COUNT_CHUNK_LINES", 4)
        total, after, steps = 0, 0, 0
        while after is not None:
            answer = count_matches(job.pk, query, after=after, through=len(MIXED_LOG), seconds=0)
            total, after, steps = total + answer.count, answer.next, steps + 1
        assert total == expected
        if "regex" in query or "level" in query:
            assert steps > 1
        monkeypatch.undo()
    assert count_matches(job.pk, {"q": "loss"}, after=0, through=11).count == 2  # only up to `through`


def test_a_pattern_with_a_back_reference_is_refused_where_it_was_typed():
    form = LogQueryForm({"q": "(a)\\1", "regex": "1"})
    assert not form.is_valid()
    assert "RE2" in form.errors["q"][0] and "back-references" in form.errors["q"][0]
    assert LogQueryForm({"q": "(a)\\1"}).is_valid()  # as plain text it is only a text to look for
    assert LogQueryForm({"q": "(a)\\1", "regex": "0"}).is_valid()


@hypothesis_settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=queries, limit=st.integers(1, 12), window=st.integers(1, 40), batch=st.integers(1, 20))
def test_a_search_read_back_in_pages_reaches_the_start_with_each_matching_line_once(
        mixed_job, query, limit, window, batch, monkeypatch):
    monkeypatch.setattr("jobs.logs.search.SEARCH_BATCH_LINES", batch)
    expected = [line.seq for line in mixed_job.log_lines.order_by("seq") if reference_filter(line, query)]
    pages, before = [], len(MIXED_LOG) + 1
    for _ in range(500):
        page = search_before(mixed_job.pk, before, query, limit, total=len(MIXED_LOG), window=window)
        assert len(page.lines) <= limit and all(line.seq < before for line in page.lines)
        pages.insert(0, [line.seq for line in page.lines])
        if page.previous is None:
            break
        before = page.previous
    assert [seq for page in pages for seq in page] == expected
