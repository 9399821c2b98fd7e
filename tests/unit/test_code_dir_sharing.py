"""Code directories belong to their owner (jobs.submission.access.visible_code_dirs): private unless shared with everyone
or with one group, and a job runs only a code directory its owner may see.

The people: the owner, a teammate who shares the group "team" with the owner, and a stranger in no group
of the owner's (tests.fixtures).
"""

import io
import zipfile

import pytest
from django.contrib.auth.models import Group, Permission
from django.http import QueryDict

from jobs.code_dirs.service import register, register_examples
from jobs.models import CodeDirectory, Engine, EngineVersion, LauncherDefaults, Node, ResourceSpec, TrainingJob
from jobs.pages.preview import preview
from jobs.submission.forms import TrainingJobForm, page_data
from tests.fixtures import api_client

pytestmark = pytest.mark.django_db

PRIVATE, EVERYONE, GROUP = CodeDirectory.Sharing.PRIVATE, CodeDirectory.Sharing.EVERYONE, CodeDirectory.Sharing.GROUP


@pytest.fixture
def team(owner, teammate):
    group = Group.objects.create(name="team")
    group.user_set.add(owner, teammate)
    return group


@pytest.fixture
def catalogue(settings, tmp_path):
    """An engine, a spec with two nodes, and the shipped examples (everyone's)."""
    settings.CODE_DIRS_ROOT = tmp_path / "code-dirs"
    register_examples()
    EngineVersion.objects.create(engine=Engine.objects.create(name="MPI"), version="local", python="/usr/bin/python3")
    spec = ResourceSpec.objects.create(name="cpu", cpu_cores=2, memory_gb=4, cpu_slots_per_node=2, max_nodes=4)
    for index in range(2):
        Node.objects.create(name=f"n{index}", address=f"10.0.0.{index + 1}", spec=spec)
    LauncherDefaults.current()


def code_dir_of(owner, name: str, tmp_path, sharing: str = PRIVATE, group=None) -> CodeDirectory:
    folder = tmp_path / "registered" / name
    folder.mkdir(parents=True)
    (folder / "train.py").write_text("print('secret work')\n")
    code_dir = register(name, folder, owner=owner, sharing=sharing)
    if group is not None:
        code_dir.shared_with = group
        code_dir.save()
    return code_dir


def listed(user) -> set[str]:
    return {item["name"] for item in api_client(user).get("/api/v1/code-dirs").json()}


def job_body(code_dir, **overrides) -> dict:
    return {"name": "train-1", "engine": "MPI", "code_dir": code_dir, "boot_file": "train.py", "spec": "cpu",
            "node_count": 2, **overrides}


def small_zip() -> io.BytesIO:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("mine/train.py", "print(1)\n")
    buffer.seek(0)
    buffer.name = "mine.zip"
    return buffer


# Who sees what --------------------------------------------------------------------------------------


def test_an_uploaded_code_dir_is_private_to_its_uploader(catalogue, owner, teammate, stranger, team):
    response = api_client(owner).post("/api/v1/code-dirs", {"name": "mine", "archive": small_zip()}, format="multipart")

    assert response.status_code == 201, response.content
    assert (response.json()["sharing"], response.json()["owner"], response.json()["group"]) == ("private", "owner", None)
    assert "mine" in listed(owner)
    assert "mine" not in listed(teammate) and "mine" not in listed(stranger)
    assert api_client(stranger).get(f"/api/v1/code-dirs/{response.json()['id']}").status_code == 404


def test_a_code_dir_shared_with_a_group_is_seen_by_a_teammate_in_it_and_not_by_a_stranger(
        catalogue, owner, teammate, stranger, team, tmp_path):
    code_dir_of(owner, "shared", tmp_path, sharing=GROUP, group=team)

    assert "shared" in listed(owner) and "shared" in listed(teammate)
    assert "shared" not in listed(stranger)


def test_everyone_sees_the_shipped_examples_and_a_code_dir_shared_with_everyone(catalogue, owner, stranger, tmp_path):
    code_dir_of(owner, "public", tmp_path, sharing=EVERYONE)

    assert {"gpu-train", "public"} <= listed(stranger)


def test_a_group_code_dir_with_no_group_is_seen_by_its_owner_only(catalogue, owner, teammate, team, tmp_path):
    code_dir_of(owner, "nobodys-group", tmp_path, sharing=GROUP)

    assert "nobodys-group" in listed(owner) and "nobodys-group" not in listed(teammate)


def test_staff_see_only_what_is_shared_unless_given_the_view_permission(catalogue, owner, staff, tmp_path):
    code_dir_of(owner, "private", tmp_path)
    assert "private" not in listed(staff)

    staff.user_permissions.add(Permission.objects.get(codename="view_codedirectory"))
    staff = type(staff).objects.get(pk=staff.pk)  # permissions are cached on the user object

    assert "private" in listed(staff)


# Running a job with one ----------------------------------------------------------------------------


@pytest.mark.parametrize("by", ["name", "id"])
def test_a_stranger_cannot_submit_a_job_with_the_owners_private_code_dir_by_name_or_by_id(
        catalogue, owner, stranger, tmp_path, django_capture_on_commit_callbacks, by):
    private = code_dir_of(owner, "private", tmp_path)

    given = private.name if by == "name" else private.pk

    with django_capture_on_commit_callbacks(execute=False):
        response = api_client(stranger).post("/api/v1/training-jobs", job_body(given), format="json")

    assert response.status_code == 400
    assert response.json() == {"code_dir": [f"{given} is not one of the available choices."]}, "as if it did not exist"
    assert not TrainingJob.objects.exists()


def test_the_owner_and_a_teammate_submit_jobs_with_a_code_dir_shared_with_their_group(
        catalogue, owner, teammate, team, tmp_path, django_capture_on_commit_callbacks):
    code_dir_of(owner, "shared", tmp_path, sharing=GROUP, group=team)

    with django_capture_on_commit_callbacks(execute=False):
        for user in (owner, teammate):
            response = api_client(user).post("/api/v1/training-jobs", job_body("shared", name=f"by-{user.username}"),
                                             format="json")
            assert response.status_code == 201, response.content

    assert set(TrainingJob.objects.values_list("owner__username", flat=True)) == {"owner", "teammate"}


def test_the_job_form_with_no_user_accepts_only_everyones_code_dirs(catalogue, owner, team, tmp_path):
    code_dir_of(owner, "private", tmp_path)
    code_dir_of(owner, "shared", tmp_path, sharing=GROUP, group=team)

    for name in ("private", "shared"):
        form = TrainingJobForm(job_body(name))
        assert not form.is_valid() and list(form.errors) == ["code_dir"], form.errors
    assert TrainingJobForm(job_body("gpu-train")).is_valid()
    assert TrainingJobForm(job_body("private"), user=owner).is_valid()


def _page_post(code_dir) -> QueryDict:
    post = QueryDict(mutable=True)
    for key, value in {"name": "page-job", "engine": EngineVersion.objects.get().pk, "code_dir": code_dir.pk,
                       "boot_file": "train.py", "spec": ResourceSpec.objects.get().pk, "node_count": "1"}.items():
        post[key] = str(value)
    return post


def test_the_creation_page_offers_a_stranger_none_of_the_owners_private_code_dirs(catalogue, client, owner, stranger, tmp_path):
    code_dir_of(owner, "private-work", tmp_path)

    client.force_login(stranger)
    page = client.get("/jobs/new").content.decode()
    assert "gpu-train" in page and "private-work" not in page
    client.force_login(owner)
    assert "private-work" in client.get("/jobs/new").content.decode()


def test_a_stranger_cannot_submit_the_owners_private_code_dir_through_the_page_either(catalogue, client, owner, stranger, tmp_path):
    private = code_dir_of(owner, "private", tmp_path)
    client.force_login(stranger)

    response = client.post("/jobs/new", _page_post(private))

    assert response.status_code == 200, "the form is shown again, with its errors"
    assert "code_dir" in response.context["form"].errors
    assert not TrainingJob.objects.exists()


def test_the_preview_shows_a_stranger_no_boot_file_of_the_owners_private_code_dir(catalogue, client, owner, stranger, tmp_path):
    private = code_dir_of(owner, "private", tmp_path)

    client.force_login(stranger)
    answer = client.post("/jobs/preview", _page_post(private)).json()
    assert answer["boot_files"] == [] and "code_dir" in answer["errors"]
    assert preview(TrainingJobForm(page_data(_page_post(private)), user=owner))["boot_files"] == ["train.py"]


# Sharing it -----------------------------------------------------------------------------------------


def test_the_uploader_chooses_to_share_with_their_group_on_upload(catalogue, owner, teammate, stranger, team):
    response = api_client(owner).post("/api/v1/code-dirs", {"name": "mine", "archive": small_zip(), "sharing": "group",
                                                            "group": "team"}, format="multipart")

    assert response.status_code == 201, response.content
    assert (response.json()["sharing"], response.json()["group"]) == ("group", "team")
    assert "mine" in listed(teammate) and "mine" not in listed(stranger)


def test_an_uploader_cannot_share_with_a_group_they_are_not_in(catalogue, stranger, team, settings):
    response = api_client(stranger).post("/api/v1/code-dirs", {"name": "mine", "archive": small_zip(), "group": "team"},
                                         format="multipart")

    assert response.status_code == 400
    assert "only with a group you belong to" in response.json()["group"][0]
    assert not CodeDirectory.objects.filter(name="mine").exists()
    assert not (settings.CODE_DIRS_ROOT / "mine").exists()


def test_the_owner_shares_a_code_dir_with_their_group_and_then_makes_it_private_again(catalogue, owner, teammate, team, tmp_path):
    code_dir = code_dir_of(owner, "mine", tmp_path)
    api = api_client(owner)

    shared = api.patch(f"/api/v1/code-dirs/{code_dir.pk}", {"sharing": "group", "group": "team"}, format="json")
    assert shared.status_code == 200, shared.content
    assert (shared.json()["sharing"], shared.json()["group"]) == ("group", "team")
    assert "mine" in listed(teammate)

    private = api.patch(f"/api/v1/code-dirs/{code_dir.pk}", {"sharing": "private"}, format="json")
    assert (private.json()["sharing"], private.json()["group"]) == ("private", None)
    assert "mine" not in listed(teammate)

    assert api.patch(f"/api/v1/code-dirs/{code_dir.pk}", {"sharing": "everyone"}, format="json").json()["sharing"] == "everyone"


def test_only_the_owner_may_change_whom_a_code_dir_is_shared_with(catalogue, owner, teammate, stranger, team, tmp_path):
    code_dir = code_dir_of(owner, "mine", tmp_path, sharing=GROUP, group=team)

    assert api_client(teammate).patch(f"/api/v1/code-dirs/{code_dir.pk}", {"sharing": "everyone"}, format="json").status_code == 403
    assert api_client(stranger).patch(f"/api/v1/code-dirs/{code_dir.pk}", {"sharing": "everyone"}, format="json").status_code == 404
    code_dir.refresh_from_db()
    assert code_dir.sharing == GROUP


def test_sharing_with_a_group_needs_a_group_of_the_owners_and_nothing_else_can_be_changed(catalogue, owner, tmp_path):
    code_dir = code_dir_of(owner, "mine", tmp_path)
    Group.objects.create(name="others")
    api = api_client(owner)

    assert "group" in api.patch(f"/api/v1/code-dirs/{code_dir.pk}", {"sharing": "group"}, format="json").json()
    assert "group" in api.patch(f"/api/v1/code-dirs/{code_dir.pk}", {"group": "others"}, format="json").json()
    assert "group" in api.patch(f"/api/v1/code-dirs/{code_dir.pk}", {"sharing": "everyone", "group": "others"}, format="json").json()
    assert "sharing" in api.patch(f"/api/v1/code-dirs/{code_dir.pk}", {"sharing": "world"}, format="json").json()
    assert "name" in api.patch(f"/api/v1/code-dirs/{code_dir.pk}", {"name": "renamed"}, format="json").json()
    code_dir.refresh_from_db()
    assert (code_dir.name, code_dir.sharing, code_dir.shared_with) == ("mine", PRIVATE, None)


def test_a_name_is_refused_only_when_its_uploader_already_has_one_of_that_name(catalogue, owner, stranger, tmp_path,
                                                                              settings):
    settings.CODE_DIRS_ROOT = str(tmp_path / "code-dirs")
    code_dir_of(owner, "taken", tmp_path)

    again = api_client(owner).post("/api/v1/code-dirs", {"name": "taken", "archive": small_zip()}, format="multipart")
    theirs = api_client(stranger).post("/api/v1/code-dirs", {"name": "taken", "archive": small_zip()}, format="multipart")

    assert again.status_code == 400 and "You already have" in again.json()["name"][0]
    assert theirs.status_code == 201, theirs.content
    assert {(item.owner.username, item.name) for item in CodeDirectory.objects.filter(name="taken")} == {
        ("owner", "taken"), ("stranger", "taken")}


