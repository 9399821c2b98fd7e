"""What one user names is theirs: another user may reuse a private code directory's name without learning
that it exists, and submits with their own directory of that name; oversized variables are refused."""

import io
import zipfile

import pytest

from jobs.models import CodeDirectory, TrainingJob
from tests.fixtures import api_client, job_body

pytestmark = pytest.mark.django_db


def archive(program: str) -> io.BytesIO:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped:
        zipped.writestr("code/train.py", program)
    buffer.seek(0)
    buffer.name = "code.zip"
    return buffer


def upload(user, name: str, program: str = "print(1)\n"):
    return api_client(user).post("/api/v1/code-dirs", {"name": name, "archive": archive(program)}, format="multipart")


@pytest.mark.attack("a user uploads a code directory under the name of another user's private one",
                    "accepted as theirs; nothing says the other exists")
def test_a_private_code_directory_name_tells_nobody_else_that_it_exists(catalogue, owner, stranger):
    assert upload(owner, "secret-project").status_code == 201

    probe = upload(stranger, "secret-project")

    assert probe.status_code == 201, probe.content
    assert "already" not in probe.content.decode()
    assert [item["owner"] for item in api_client(stranger).get("/api/v1/code-dirs").json()
            if item["name"] == "secret-project"] == ["stranger"]


def test_a_submission_naming_a_directory_takes_the_users_own_before_anyone_elses(catalogue, owner, stranger):
    assert upload(stranger, "shared-name").status_code == 201
    CodeDirectory.objects.filter(owner=stranger).update(sharing=CodeDirectory.Sharing.EVERYONE)
    assert upload(owner, "shared-name").status_code == 201

    response = api_client(owner).post("/api/v1/training-jobs", job_body(code_dir="shared-name"), format="json")

    assert response.status_code == 201, response.content
    assert TrainingJob.objects.get(pk=response.json()["id"]).code_dir.owner == owner


@pytest.mark.attack("a 1 MiB environment variable value is submitted", "refused at the field with the limit said")
def test_an_environment_value_past_the_limit_is_refused_where_it_was_typed(catalogue, owner):
    response = api_client(owner).post("/api/v1/training-jobs", job_body(env={"BIG": "x" * (1 << 20)}), format="json")

    assert response.status_code == 400
    assert "longer than 4096 characters" in str(response.json()["env"])
    assert not TrainingJob.objects.exists()


def test_many_long_variables_are_refused_in_all(catalogue, owner):
    env = {f"VAR_{index}": "x" * 4000 for index in range(10)}
    response = api_client(owner).post("/api/v1/training-jobs", job_body(env=env), format="json")

    assert response.status_code == 400 and "in all" in str(response.json()["env"])
