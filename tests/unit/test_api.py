"""The JSON API: validation errors name their field, tokens work, archives are checked before use."""

import io
import json
import tarfile
import zipfile

import pytest
from rest_framework.test import APIClient

from jobs.models import TrainingJob
from tests.fixtures import job_body

pytestmark = pytest.mark.django_db


def test_a_stranger_without_a_token_is_refused(catalogue):
    assert APIClient().get("/api/v1/training-jobs").status_code in (401, 403)


def test_the_owner_submits_a_job_with_a_token_and_it_is_pending(api, catalogue, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        response = api.post("/api/v1/training-jobs", job_body(), format="json")
    assert response.status_code == 201, response.content
    job = TrainingJob.objects.get(pk=response.json()["id"])
    assert job.status == "Pending"
    assert job.parameters == [{"name": "lr", "value": "0.1"}]
    assert job.bind_args == "-bind-to none -map-by slot"
    assert api.get("/api/v1/training-jobs").json()["results"][0]["name"] == "train-1"


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"name": "bad name!"}, "name"),
        ({"name": "x" * 65}, "name"),
        ({"boot_file": "../outside.py"}, "boot_file"),
        ({"boot_file": "missing.py"}, "boot_file"),
        ({"env": {"MA_SECRET": "1"}}, "env"),
        ({"env": {"1BAD": "1"}}, "env"),
        ({"env": {"LINES": "a\nb"}}, "env"),
        ({"env": {f"V{i}": "1" for i in range(101)}}, "env"),
        ({"parameters": [{"name": "a b", "value": "1"}]}, "parameters"),
        ({"parameters": [{"name": "lr", "value": "1"}, {"name": "lr", "value": "2"}]}, "parameters"),
        ({"spec": "no-such-spec"}, "spec"),
        ({"node_count": 0}, "node_count"),
        ({"node_count": 5}, "node_count"),
        ({"extra_args": "-np 64"}, "extra_args"),
        ({"extra_args": "-x 'unclosed"}, "extra_args"),
    ],
)
def test_bad_input_gets_an_error_naming_its_field_and_no_job(api, catalogue, overrides, field):
    response = api.post("/api/v1/training-jobs", job_body(**overrides), format="json")
    assert response.status_code == 400
    assert field in response.json(), response.json()
    assert not TrainingJob.objects.exists()


def test_a_body_with_several_bad_fields_gets_every_one_of_them_named_not_only_the_first(api, catalogue):
    unstorable = job_body(name="a\u0000b", description="\ud800", env={"X": "\u0000"})
    deep: list = ["deep"]
    for _ in range(40):
        deep = [deep]
    unstorable["extra_args"] = deep

    # As a client writes it: the surrogate as a JSON escape (the test client would not encode it as text).
    answer = api.post("/api/v1/training-jobs", json.dumps(unstorable), content_type="application/json")

    assert answer.status_code == 400
    assert answer.json() == {"name": ["Holds a NUL character, which no field takes."],
                             "description": ["Holds an unpaired surrogate (\\ud800-\\udfff), which is not text."],
                             "env": ["Holds a NUL character, which no field takes."],
                             "extra_args": ["Nested more than 32 levels deep."]}

    wrong = job_body(engine_version="no-such-version", boot_file="../outside.py", spec="no-such-spec", node_count=0)
    answer = api.post("/api/v1/training-jobs", wrong, format="json")

    assert answer.status_code == 400
    assert {"engine_version", "boot_file", "spec", "node_count"} <= set(answer.json()), answer.json()
    assert all(isinstance(messages, list) and messages for messages in answer.json().values())
    assert not TrainingJob.objects.exists()


def _tar_gz(entries) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data, link in entries:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    buffer.name = "code.tar.gz"
    return buffer


def test_an_uploaded_archive_becomes_a_code_directory(api, catalogue):
    archive = _tar_gz([("mycode/train.py", b"print(1)\n", None), ("mycode/lib/util.py", b"", None)])
    response = api.post("/api/v1/code-dirs", {"name": "mycode", "archive": archive}, format="multipart")
    assert response.status_code == 201, response.content
    assert response.json()["file_count"] == 2
    assert api.post("/api/v1/training-jobs", job_body(code_dir="mycode", boot_file="lib/util.py"), format="json").status_code == 201


@pytest.mark.parametrize(
    "entries, reason",
    [
        ([("../evil.py", b"x", None)], "outside"),
        ([("code/link", None, "/etc/passwd")], "outside"),
        ([("code/link", None, "../../x")], "outside"),
    ],
)
def test_an_archive_that_escapes_its_folder_is_refused(api, catalogue, entries, reason):
    response = api.post("/api/v1/code-dirs", {"name": "evil", "archive": _tar_gz(entries)}, format="multipart")
    assert response.status_code == 400
    assert reason in response.json()["archive"][0]


def test_a_zip_over_the_size_limit_is_refused(api, catalogue, settings):
    settings.CODE_DIR_MAX_UNPACKED_BYTES = 10
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("big/train.py", "x" * 100)
    buffer.seek(0)
    buffer.name = "big.zip"
    response = api.post("/api/v1/code-dirs", {"name": "big", "archive": buffer}, format="multipart")
    assert response.status_code == 400
    assert "unpacks to 100 bytes; at most 10 are allowed" in response.json()["archive"][0]
