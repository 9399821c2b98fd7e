"""From mpirun's output to stored lines: splitting, rank tags, batching in order, the cap, bounded memory."""

import asyncio

import pytest
from django.db import OperationalError
from hypothesis import given
from hypothesis import strategies as st

from jobs.logs import sink as sink_module
from jobs.logs.sink import PENDING_BATCHES, LogSink
from jobs.logs.store import LogRecord, store_lines
from jobs.models import LogStream
from jobs.runtime.mpirun_output import CUT_MARK, MpirunOutput
from jobs.runtime.ssh_output import STDERR, STDOUT, BoundedOutput
from tests.unit.log_helpers import quiet_redis  # noqa: F401


def rank_lines(records):
    return [(record.rank, record.stream, record.text) for record in records]


def read_all(chunks, max_chars=1000, stream=LogStream.STDOUT):
    output = MpirunOutput(stream, rank_workers=(0, 0, 1, 1), max_chars=max_chars)
    records = [record for chunk in chunks for record in output.feed(chunk)]
    return records + output.finish()


def test_pieces_of_one_ranks_line_split_by_another_ranks_piece_are_joined_again():
    # What Open MPI 4 prints for unbuffered programs: the text and its newline are tagged separately.
    printed = ("[1,0]<stdout>:SEQ 0 0[1,2]<stdout>:SEQ 2 0\n"
               "[1,3]<stdout>:SEQ 3 0[1,3]<stdout>:\n"
               "[1,0]<stdout>:\n"
               "[1,1]<stdout>:a\n[1,1]<stdout>:b[1,2]<stdout>:c\n[1,1]<stdout>:d\n")
    assert rank_lines(read_all([printed])) == [
        (2, "stdout", "SEQ 2 0"), (3, "stdout", "SEQ 3 0"), (0, "stdout", "SEQ 0 0"),
        (1, "stdout", "a"), (2, "stdout", "c"), (1, "stdout", "bd"),
    ]


@given(numbers=st.lists(st.tuples(st.integers(0, 3), st.text(alphabet="ab[]<>:,01 ", max_size=12)), max_size=30),
       cuts=st.lists(st.integers(0, 2000), max_size=15))
def test_each_ranks_lines_come_out_whole_however_mpiruns_output_is_cut_into_chunks(numbers, cuts):
    # Each rank's line is forwarded in two tagged pieces, the text and the newline, interleaved with others'.
    printed = "".join(f"[1,{rank}]<stderr>:{text}[1,{rank}]<stderr>:\n" for rank, text in numbers)
    chunks, start = [], 0
    for cut in sorted(cuts) + [len(printed)]:
        chunks.append(printed[start:cut])
        start = max(start, cut)
    records = read_all(chunks)
    assert rank_lines(records) == [(rank, "stderr", text) for rank, text in numbers]
    assert all(record.worker_index == record.rank // 2 for record in records)


@given(lines=st.lists(st.tuples(st.sampled_from(["[1,0]<stdout>:", "[1,3]<stderr>:", "[1,7]<stdout>:", "[2,1]<stddiag>:",
                                                  "", "[1,2]<stdout", "[1,00000001]<stdout>:"]),
                                st.text(alphabet="ab]<std:\r[1,0>out é", max_size=30)), max_size=20),
       max_chars=st.integers(1, 40))
def test_whole_lines_come_out_the_same_by_the_usual_cases_short_way_as_by_the_long_one(lines, max_chars):
    printed = "".join(tag + text + "\n" for tag, text in lines)
    short_way = MpirunOutput(LogStream.STDOUT, rank_workers=(0, 0, 1, 1), max_chars=max_chars)
    long_way = MpirunOutput(LogStream.STDOUT, rank_workers=(0, 0, 1, 1), max_chars=max_chars)
    long_way.pending[(9, LogStream.STDOUT)] = ""  # a piece held of a rank no line names: no line takes the short way
    assert [(r.rank, r.worker_index, r.stream, r.text) for r in short_way.feed(printed)] == [
        (r.rank, r.worker_index, r.stream, r.text) for r in long_way.feed(printed)]


def test_mpiruns_own_words_have_no_rank_and_are_worker_0s():
    records = read_all(["--------\nmpirun noticed that process rank 3 exited\n[1,3]<stdout>:bye\n"], stream="stderr")
    assert [(record.rank, record.worker_index, record.stream, record.text) for record in records] == [
        (None, 0, "stderr", "--------"), (None, 0, "stderr", "mpirun noticed that process rank 3 exited"),
        (3, 1, "stdout", "bye")]


def test_a_line_that_never_ends_is_held_only_up_to_the_limit_and_stored_cut():
    output = MpirunOutput(LogStream.STDOUT, rank_workers=(0, 0, 1, 1), max_chars=10)
    assert output.feed("[1,0]<stdout>:0123456789abc") == []
    for _ in range(1000):
        output.feed("[1,0]<stdout>:" + "x" * 1000)
    assert sum(len(text) for text in output.pending.values()) < 40
    assert rank_lines(output.feed("[1,0]<stdout>:end\n[1,1]<stdout>:next\n")) == [
        (0, "stdout", "0123456789 …[line cut]"), (1, "stdout", "next")]
    assert rank_lines(output.feed("[1,1]<stdout>:unfinished") + output.finish()) == [(1, "stdout", "unfinished")]


@pytest.mark.parametrize("piece", [4096, 16384, 65536, 20 * 1024 * 1024], ids=["4k", "16k", "64k", "one-piece"])
@pytest.mark.parametrize("chunk", [32768, 65536 + 13, 1 << 20])
def test_a_20_mb_line_is_cut_with_its_mark_and_the_ranks_next_line_arrives_whole_however_it_is_chunked(piece, chunk):
    """mpirun tags each piece it forwards; the SSH channel cuts the stream anywhere, the next line's tag included."""
    limit = 16384
    overlong = "".join("0123456789abcdef"[(index // 7) % 16] for index in range(20 * 1024 * 1024 // 64)) * 64
    printed = "".join("[1,0]<stdout>:" + overlong[start:start + piece] for start in range(0, len(overlong), piece))
    printed += "\n[1,0]<stdout>:next line\n[1,2]<stdout>:other rank\n[1,0]<stdout>:after\n"
    output = MpirunOutput(LogStream.STDOUT, rank_workers=(0, 0, 1, 1), max_chars=limit)

    records = []
    for start in range(0, len(printed), chunk):
        records += output.feed(printed[start:start + chunk])
    records += output.finish()

    assert [(record.rank, record.text) for record in records] == [
        (0, overlong[:limit] + CUT_MARK), (0, "next line"), (2, "other rank"), (0, "after")]
    assert output.pending == {}


async def _produce(sink: LogSink, name: str, count: int) -> None:
    for number in range(count):
        await sink.add(LogRecord(text=f"{name} {number}", rank=0 if name == "out" else 1, worker_index=0))
        if number % 97 == 0:
            await asyncio.sleep(0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("quiet_redis")
def test_two_streams_written_at_once_are_stored_completely_each_in_its_own_order(make_job):
    job = make_job()

    async def run():
        async with LogSink(job.pk, batch_lines=50, interval=0.01) as sink:
            await asyncio.gather(_produce(sink, "out", 3000), _produce(sink, "err", 2000))

    asyncio.run(run())
    stored = list(job.log_lines.order_by("seq").values_list("seq", "text"))
    assert [seq for seq, _text in stored] == list(range(1, 5001))
    for name, count in (("out", 3000), ("err", 2000)):
        assert [text for _seq, text in stored if text.startswith(name + " ")] == [f"{name} {n}" for n in range(count)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("quiet_redis")
def test_readers_wait_while_the_writer_is_behind_so_buffered_lines_stay_bounded(make_job, monkeypatch):
    job = make_job()
    peak = 0

    async def run():
        nonlocal peak
        async with LogSink(job.pk, batch_lines=20, interval=10) as sink:
            async def watch():
                nonlocal peak
                while True:
                    buffered = len(sink.batch) + sum(len(batch) for batch, _dropped, _mark in sink.queue._queue)
                    peak = max(peak, buffered)
                    await asyncio.sleep(0)

            watcher = asyncio.create_task(watch())
            await _produce(sink, "out", 2000)
            watcher.cancel()

    asyncio.run(run())
    assert job.log_lines.count() == 2000
    # Batches were seen waiting (the watcher looked while the writer was behind), and never more than the queue holds.
    assert 20 < peak <= (PENDING_BATCHES + 1) * 20 + 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("quiet_redis")
def test_long_lines_are_handed_over_by_their_size_before_a_batch_has_its_lines(make_job, monkeypatch):
    monkeypatch.setattr(sink_module, "BATCH_MAX_CHARS", 1000)
    job = make_job()
    batches: list[int] = []

    async def run():
        async with LogSink(job.pk, batch_lines=10_000, interval=10,
                           on_stored=lambda lines: batches.append(len(lines))) as sink:
            for number in range(100):
                await sink.add(LogRecord(text=f"{number:03d}" + "x" * 97, rank=0, worker_index=0))

    asyncio.run(run())
    assert list(job.log_lines.order_by("seq").values_list("text", flat=True)) == [
        f"{number:03d}" + "x" * 97 for number in range(100)]
    assert batches == [10] * 10


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("quiet_redis")
def test_once_the_cap_is_reached_the_sink_counts_dropped_lines_without_storing_them(make_job):
    job = make_job(log_cap_bytes=100)

    async def run():
        async with LogSink(job.pk, batch_lines=10, interval=0.01) as sink:
            await _produce(sink, "out", 1000)
            return sink.capped

    assert asyncio.run(run())
    job.refresh_from_db()
    notes = job.log_lines.filter(stream=LogStream.SYSTEM, text__startswith="Log cap reached")
    assert notes.count() == 1
    kept = job.log_lines.exclude(stream=LogStream.SYSTEM).count()
    assert kept + job.log_lines_dropped == 1000
    assert job.log_bytes <= 100


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("quiet_redis")
def test_a_batch_that_meets_a_locked_database_is_stored_once_it_is_free_again(make_job, monkeypatch):
    job = make_job()
    attempts = []

    def locked_once(*args):
        attempts.append(args)
        if len(attempts) == 1:
            raise OperationalError("database is locked")
        return store_lines(*args)

    monkeypatch.setattr(sink_module, "store_lines", locked_once)
    monkeypatch.setattr(sink_module, "STORE_RETRY_SECONDS", (0.01,))

    async def run():
        async with LogSink(job.pk, batch_lines=5, interval=10) as sink:
            await _produce(sink, "out", 12)

    asyncio.run(run())
    assert list(job.log_lines.order_by("seq").values_list("text", flat=True)) == [f"out {n}" for n in range(12)]
    assert len(attempts) >= 2


class FakeChannel:
    def __init__(self, window):
        self.window, self.paused = window, False

    def get_recv_window(self):
        return self.window

    def pause_reading(self):
        self.paused = True

    def resume_reading(self):
        self.paused = False


def test_the_ssh_output_pauses_the_channel_when_full_and_resumes_only_when_a_window_fits_again():
    async def run():
        output, channel = BoundedOutput(), FakeChannel(window=10)
        output.connection_made(channel)
        for number in range(7):
            output.data_received("x" * 5, STDOUT if number % 2 == 0 else STDERR)
        assert channel.paused and output.size == 35
        chunks = []
        while output.size > 10:
            chunks.append(await output.read())
            assert channel.paused == (output.size > 10)
        output.connection_lost(None)
        while (chunk := await output.read()) is not None:
            chunks.append(chunk)
        return chunks

    chunks = asyncio.run(run())
    assert [datatype for _data, datatype in chunks] == [STDOUT, STDERR] * 3 + [STDOUT]
