"""Outputs larger than a part go to the store in parts: how a file is cut, which answer of the node's lets the
parts be joined, the node's upload script against a real HTTP server standing for the store's part URLs, and
one sync with the SSH and store boundaries faked (the real store is in tests/integration/test_object_storage.py).
"""

import asyncio
import hashlib
import json
import subprocess
import sys
from contextlib import asynccontextmanager
from dataclasses import replace

import pytest
from django.test import override_settings

from jobs.object_store.client import StoreError
from jobs.object_store.parts import MIB, MOST_PARTS, SMALLEST_PART_BYTES, PartPlan, part_plan, parts_taken
from jobs.runtime import data_out
from jobs.runtime.data_out import UPLOAD_SCRIPT
from tests.http_recorder import Answer, Recorder
from tests.unit.test_object_storage import a_sync


def test_a_file_no_larger_than_a_part_goes_in_one_put():
    assert part_plan(64 * MIB, 64 * MIB) is None
    assert part_plan(0, 64 * MIB) is None


def test_a_larger_file_is_cut_into_parts_of_the_setting_the_last_one_shorter():
    assert part_plan(130 * MIB, 64 * MIB) == PartPlan(64 * MIB, 3)


def test_a_part_is_never_smaller_than_the_five_mib_a_store_takes():
    assert part_plan(12 * MIB, 1024) == PartPlan(SMALLEST_PART_BYTES, 3)


def test_a_file_that_would_need_more_than_ten_thousand_parts_gets_larger_parts_in_whole_mib():
    size = 2 * 1024 * 1024 * MIB + 12345  # 2 TiB and a little
    plan = part_plan(size, 64 * MIB)
    assert plan is not None and plan.count <= MOST_PARTS and plan.part_bytes % MIB == 0
    assert plan.part_bytes * plan.count >= size and plan.part_bytes * (plan.count - 1) < size


def test_a_large_files_part_urls_last_as_long_as_its_upload_at_a_slow_rate_within_a_week():
    from jobs.runtime.data_out import parts_url_lifetime

    assert parts_url_lifetime(64 * MIB) == 3600 + 7
    assert parts_url_lifetime(500 * 1024 * MIB) == 3600 + 51_200, "500 GiB at 10 MiB/s"
    assert parts_url_lifetime(5 * 1024 * 1024 * MIB) == 3600 + 524_288, "5 TiB, the largest object"
    assert parts_url_lifetime(8 * 1024 * 1024 * MIB) == 7 * 24 * 3600


def test_the_parts_are_joined_only_with_one_etag_a_part_and_nothing_made_up():
    plan = PartPlan(5 * MIB, 2)
    assert parts_taken(['"9b2cf535f27731c974343645a3985328"', "0cc175b9c0f1b6a831c399e269772661"], plan) == [
        '"9b2cf535f27731c974343645a3985328"', '"0cc175b9c0f1b6a831c399e269772661"']
    for forged in (['"a"'], ['"a"', '"b"', '"c"'], ['"a"', 5], ['"a"', ""], ['"a b"', '"c"'], ['"a"', '"b\\"c"'],
                   ['"a"', "x" * 200], ['"a"', '"b"\n'], "ab", None, {"1": "a", "2": "b"}):
        assert parts_taken(forged, plan) is None, forged


@pytest.fixture
def part_server():
    """A plain HTTP server standing for the store's presigned part URLs: it keeps each PUT and answers with its
    body's MD5 as the ETag, as S3 does."""
    etag = lambda request: Answer(200, {"ETag": f'"{hashlib.md5(request.body).hexdigest()}"'})  # noqa: E731
    with Recorder(answer=etag) as server:
        yield server


def bodies_put(server: Recorder) -> dict[str, bytes]:
    return {request.path: request.body for request in server.seen if request.method == "PUT"}


def upload(folder, manifest) -> list[dict]:
    answer = subprocess.run([sys.executable, "-c", UPLOAD_SCRIPT, str(folder)], input=json.dumps(manifest),
                            capture_output=True, text=True, check=True)
    return [json.loads(line) for line in answer.stdout.splitlines()]


def test_the_node_sends_each_part_to_its_own_url_and_hands_back_their_etags(tmp_path, part_server):
    content = bytes(range(256)) * (11 * 1024 * 4)  # 11 MiB
    (tmp_path / "model.pt").write_bytes(content)
    parts = {"size": len(content), "part_bytes": 5 * MIB,
             "urls": [f"{part_server.url}/part/{number}" for number in (1, 2, 3)]}

    [answer] = upload(tmp_path, [{"path": "model.pt", "parts": parts}])
    bodies = bodies_put(part_server)

    assert answer["size"] == len(content)
    assert b"".join(bodies[f"/part/{number}"] for number in (1, 2, 3)) == content
    assert [len(bodies[f"/part/{number}"]) for number in (1, 2, 3)] == [5 * MIB, 5 * MIB, MIB]
    assert answer["etags"] == [f'"{hashlib.md5(bodies[f"/part/{number}"]).hexdigest()}"' for number in (1, 2, 3)]


def test_a_file_that_shrank_since_the_listing_is_not_sent_in_the_parts_cut_for_its_old_size(tmp_path, part_server):
    (tmp_path / "model.pt").write_bytes(b"x" * (6 * MIB))
    parts = {"size": 11 * MIB, "part_bytes": 5 * MIB,
             "urls": [f"{part_server.url}/part/{number}" for number in (1, 2, 3)]}

    [answer] = upload(tmp_path, [{"path": "model.pt", "parts": parts}])

    assert "shrank while it was being uploaded" in answer["error"] and not bodies_put(part_server)


def test_a_file_that_grew_since_the_listing_is_sent_as_it_was_at_the_listings_size(tmp_path, part_server):
    # A log or an event file, appended all the time: a snapshot now, the whole file at the next look.
    content = bytes(range(256)) * (4096 * 13)  # 13 MiB
    (tmp_path / "events.log").write_bytes(content)
    parts = {"size": 11 * MIB, "part_bytes": 5 * MIB,
             "urls": [f"{part_server.url}/part/{number}" for number in (1, 2, 3)]}

    [answer] = upload(tmp_path, [{"path": "events.log", "parts": parts}])
    bodies = bodies_put(part_server)

    assert answer["size"] == 11 * MIB and len(answer["etags"]) == 3
    assert b"".join(bodies[f"/part/{number}"] for number in (1, 2, 3)) == content[:11 * MIB]


class FakeStore:
    """The store's side of a sync: multipart uploads opened, completed and aborted, as recorded calls."""

    def __init__(self, refuse_completion: bool = False):
        self.refuse_completion = refuse_completion
        self.started: list[str] = []
        self.completed: dict[str, list[str]] = {}
        self.aborted: list[str] = []

    def presigned_put(self, bucket, key, expires_s):
        return f"http://store/{bucket}/{key}?put"

    def start_multipart(self, bucket, key):
        self.started.append(key)
        return f"upload-{len(self.started)}"

    def presigned_part(self, bucket, key, upload_id, number, expires_s):
        return f"http://store/{bucket}/{key}?uploadId={upload_id}&partNumber={number}"

    def complete_multipart(self, bucket, key, upload_id, etags):
        if self.refuse_completion:
            raise StoreError(f"{bucket}/{key}: the store said InvalidPart.")
        self.completed[key] = etags

    def abort_multipart(self, bucket, key, upload_id):
        self.aborted.append(key)


def a_faked_sync(monkeypatch, store: FakeStore, listing: dict[str, int], answer):
    """An OutputSync whose node lists `listing` (path -> size) and answers the upload with `answer(manifest)`."""
    @asynccontextmanager
    async def no_connection():
        yield None

    async def connect(target):
        return no_connection()

    async def bounded_run(connection, argv, stdin, *, limit, timeout):
        if argv[2] == data_out.LIST_SCRIPT:
            return json.dumps({"files": [[path, size, 1] for path, size in listing.items()]})
        return answer(json.loads(stdin))

    monkeypatch.setattr(data_out, "connect", connect)
    monkeypatch.setattr(data_out, "bounded_run", bounded_run)
    sync = a_sync()
    sync.where = replace(sync.where, store=store)
    return sync


@override_settings(OUTPUT_PART_BYTES=5 * MIB)
def test_a_sync_joins_the_parts_a_node_sent_and_aborts_the_uploads_it_did_not_finish(monkeypatch):
    store = FakeStore()
    listing = {"small.txt": 10, "good.pt": 11 * MIB, "forged.pt": 11 * MIB, "failed.pt": 11 * MIB}

    def answer(manifest):
        by_path = {item["path"]: item for item in manifest}
        assert "url" in by_path["small.txt"] and len(by_path["good.pt"]["parts"]["urls"]) == 3
        return "\n".join([json.dumps({"path": "small.txt", "size": 10}),
                          json.dumps({"path": "good.pt", "size": 11 * MIB, "etags": ['"a"', '"b"', '"c"']}),
                          json.dumps({"path": "forged.pt", "size": 11 * MIB, "etags": ['"a"']}),
                          json.dumps({"path": "failed.pt", "error": "HTTP Error 503"})])

    sync = a_faked_sync(monkeypatch, store, listing, answer)
    asyncio.run(sync.sync())

    assert store.completed == {"runs/1/good.pt": ['"a"', '"b"', '"c"']}
    assert sorted(store.aborted) == ["runs/1/failed.pt", "runs/1/forged.pt"]
    assert set(sync.sent) == {"small.txt", "good.pt"}
    assert sync.failed == {"forged.pt": "its parts' upload did not answer one ETag a part", "failed.pt": "HTTP Error 503"}


@override_settings(OUTPUT_PART_BYTES=5 * MIB)
def test_parts_the_store_will_not_join_leave_the_file_unsaved_and_its_upload_aborted(monkeypatch):
    store = FakeStore(refuse_completion=True)
    sync = a_faked_sync(monkeypatch, store, {"model.pt": 6 * MIB},
                        lambda manifest: json.dumps({"path": "model.pt", "size": 6 * MIB, "etags": ['"a"', '"b"']}))
    asyncio.run(sync.sync())
    assert store.aborted == ["runs/1/model.pt"] and not sync.sent
    assert sync.failed == {"model.pt": "user-1-a/runs/1/model.pt: the store said InvalidPart."}


@override_settings(OUTPUT_PART_BYTES=5 * MIB)
def test_an_upload_cut_short_by_the_node_leaves_no_open_multipart_upload(monkeypatch):
    store = FakeStore()

    def answer(manifest):
        raise OSError("the connection was lost")

    sync = a_faked_sync(monkeypatch, store, {"model.pt": 6 * MIB, "other.pt": 7 * MIB}, answer)
    with pytest.raises(data_out.NodeError):
        asyncio.run(sync.sync())
    assert sorted(store.started) == sorted(store.aborted) == ["runs/1/model.pt", "runs/1/other.pt"]


@override_settings(OUTPUT_PART_BYTES=5 * MIB)
def test_a_second_answer_for_a_file_cannot_count_it_as_sent_when_its_parts_were_not_joined(monkeypatch):
    store = FakeStore()
    # What answers is the job's container: a forged ETag list, then a plain "done" for the same file.
    sync = a_faked_sync(monkeypatch, store, {"model.pt": 11 * MIB}, lambda manifest: "\n".join([
        json.dumps({"path": "model.pt", "size": 11 * MIB, "etags": ['"a"']}),
        json.dumps({"path": "model.pt", "size": 11 * MIB})]))
    asyncio.run(sync.sync())
    assert not sync.sent and store.completed == {} and store.aborted == ["runs/1/model.pt"]
    assert sync.result().state == "upload_partial"


@override_settings(OUTPUT_PART_BYTES=5 * MIB)
def test_a_sync_cancelled_while_the_store_opens_an_upload_still_aborts_it(monkeypatch):
    import threading

    opening = threading.Event()
    release = threading.Event()

    class SlowToOpen(FakeStore):
        def start_multipart(self, bucket, key):
            opening.set()
            release.wait(5)
            return super().start_multipart(bucket, key)

    store = SlowToOpen()
    sync = a_faked_sync(monkeypatch, store, {"model.pt": 11 * MIB}, lambda manifest: "")

    async def cancel_it_meanwhile():
        task = asyncio.create_task(sync.sync())
        await asyncio.to_thread(opening.wait, 5)
        task.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it_meanwhile())
    assert store.started == store.aborted == ["runs/1/model.pt"]


def test_no_part_is_larger_than_one_put_takes_whatever_the_setting_says():
    from jobs.object_store.parts import LARGEST_SINGLE_PUT_BYTES

    plan = part_plan(20 * 1024 * MIB, 8 * 1024 * MIB)
    assert plan is not None and plan.part_bytes == LARGEST_SINGLE_PUT_BYTES and plan.count == 4


def test_one_looks_uploads_may_take_as_long_as_their_bytes_at_the_slowest_rate():
    from jobs.runtime.data_out import upload_time_limit

    assert upload_time_limit([50 * 1024 * MIB]) == 3600 + 5120, "50 GiB at 10 MiB/s: past the hour"
    assert upload_time_limit([10, 20]) == 3601


class RecordingStore(FakeStore):
    """A FakeStore that notes, as each part upload is joined, which of the job's uploads the database keeps."""

    def __init__(self, job_id: int):
        super().__init__()
        self.job_id = job_id
        self.kept_when_joined: list[str] = []

    def complete_multipart(self, bucket, key, upload_id, etags):
        from jobs.models import OpenUpload

        # Called in a thread of its own (asyncio.to_thread), where the database may be read.
        self.kept_when_joined = sorted(OpenUpload.objects.filter(job_id=self.job_id).values_list("upload_id", flat=True))
        super().complete_multipart(bucket, key, upload_id, etags)


@pytest.mark.django_db(transaction=True)
@override_settings(OUTPUT_PART_BYTES=5 * MIB)
def test_an_upload_a_dead_console_process_left_open_is_aborted_by_the_next_sync_and_the_syncs_own_are_kept_until_ended(
        monkeypatch, make_job):
    from jobs.models import OpenUpload

    job = make_job()
    # A console process opened this one and died before joining or aborting it.
    OpenUpload.objects.create(job=job, key="runs/1/old.pt", upload_id="upload-of-a-dead-process")
    store = RecordingStore(job.pk)
    sync = a_faked_sync(monkeypatch, store, {"good.pt": 11 * MIB, "bad.pt": 11 * MIB}, lambda manifest: "\n".join([
        json.dumps({"path": "good.pt", "size": 11 * MIB, "etags": ['"a"', '"b"', '"c"']}),
        json.dumps({"path": "bad.pt", "error": "HTTP Error 503"})]))
    sync.job_id = job.pk

    asyncio.run(sync.sync())

    assert store.aborted == ["runs/1/old.pt", "runs/1/bad.pt"]
    # While the node uploaded, both of this sync's uploads were kept (the dead one was already aborted).
    assert store.kept_when_joined == ["upload-1", "upload-2"]
    assert not OpenUpload.objects.filter(job=job).exists()
    assert sync.swept, "a dead process's uploads are looked for until they are all ended, then not again"
