"""A user's own keys to an object store: which bucket they reach, the page that sets them (checked against the
store, never shown back), who may see or change them, and how they are kept. The store's side is a small
HTTP server that answers as an S3 gateway does to a HEAD of a bucket; the real store is in
tests/integration/test_object_storage.py."""

import re

import pytest
from django.db import connection
from django.test import Client
from django.utils.timezone import localtime

from jobs.models import Storage, UserStoreKeys
from jobs.object_store.access import reach
from jobs.object_store.client import StoreAccess
from jobs.object_store.urls import ObjectUrlError
from jobs.pages.store_keys import StoreKeysForm
from jobs.secret_box import open_secret
from tests.fixtures import person
from tests.http_recorder import Answer, Recorder, Request
from tests.unit.test_object_storage import FakeStorage

pytestmark = pytest.mark.django_db

TEAM_ACCESS_KEY = "AKQX7TZR0042"
TEAM_SECRET_KEY = "Zq9x7W/v2Kp4+Lm8Nj3Hb6="
TEAM_BUCKET = "team-datasets"


@pytest.fixture
def gateway():
    """The store's S3 gateway as far as the page asks it: the team's keys find team-datasets and nothing else;
    any other key is refused, as a store refuses keys it does not know."""
    def answer(request: Request) -> Answer:
        credential = re.search(r"Credential=([^/]+)/", request.headers.get("Authorization", ""))
        if not credential or credential.group(1) != TEAM_ACCESS_KEY:
            return Answer(403, {})
        return Answer(200 if request.path.strip("/") == TEAM_BUCKET else 404, {})

    with Recorder(answer=answer) as server:
        yield server.url, server


def asked(server: Recorder) -> list[tuple[str, str]]:
    """(the access key the request was signed with, the path) of each HEAD the gateway answered."""
    found = [(re.search(r"Credential=([^/]+)/", request.headers.get("Authorization", "")), request.path)
             for request in server.seen if request.method == "HEAD"]
    return [(credential.group(1) if credential else "", path) for credential, path in found]


def a_storage(name="team", endpoint="http://127.0.0.1:9", users_may_bring_keys=True) -> Storage:
    storage = Storage(name=name, endpoint_url=endpoint, users_may_bring_keys=users_may_bring_keys)
    storage.set_keys("STOREACCESS", "store-secret-key")
    storage.save()
    return storage


# Which bucket the user's keys reach.

def test_a_user_with_keys_of_their_own_reaches_another_bucket_of_the_store_with_those_keys(owner):
    storage = a_storage()
    UserStoreKeys.keep(owner, storage, TEAM_ACCESS_KEY, TEAM_SECRET_KEY)

    where = Storage.reach_for(f"s3://{TEAM_BUCKET}/mnist/", None, owner.pk, owner.username)

    assert where.with_own_keys and where.url.bucket == TEAM_BUCKET
    assert (where.store.access.access_key, where.store.access.secret_key) == (TEAM_ACCESS_KEY, TEAM_SECRET_KEY)
    assert where.endpoint_url == storage.endpoint_url


def test_a_users_own_bucket_is_still_reached_with_the_stores_keys_when_they_keep_keys_of_their_own(owner):
    storage = a_storage()
    UserStoreKeys.keep(owner, storage, TEAM_ACCESS_KEY, TEAM_SECRET_KEY)

    where = Storage.reach_for(f"s3://{storage.user_bucket(owner.pk, owner.username)}/data/", None, owner.pk,
                              owner.username)

    assert not where.with_own_keys and where.store.access.access_key == "STOREACCESS"


def test_without_keys_of_their_own_a_user_is_refused_another_bucket_and_told_where_to_add_them(owner):
    a_storage()

    with pytest.raises(ObjectUrlError) as refused:
        Storage.reach_for(f"s3://{TEAM_BUCKET}/mnist/", None, owner.pk, owner.username)

    assert "is not yours" in str(refused.value)
    assert "add your own keys to it on the Object-store keys page (/store-keys)" in str(refused.value)


def test_a_store_that_takes_no_users_keys_refuses_another_bucket_as_before_even_to_a_user_who_kept_keys(owner):
    storage = a_storage(users_may_bring_keys=False)
    UserStoreKeys.objects.create(user=owner, storage=storage, sealed_access_key="x", sealed_secret_key="y")

    with pytest.raises(ObjectUrlError) as refused:
        Storage.reach_for(f"s3://{TEAM_BUCKET}/mnist/", None, owner.pk, owner.username)

    assert "is not yours" in str(refused.value) and "own keys" not in str(refused.value)


def test_another_users_bucket_stays_out_of_reach_whatever_keys_a_user_brings(owner, stranger):
    storage = a_storage()
    UserStoreKeys.keep(stranger, storage, TEAM_ACCESS_KEY, TEAM_SECRET_KEY)
    owners_bucket = storage.user_bucket(owner.pk, owner.username)

    for text in (f"s3://{owners_bucket}/data/", f"obs://user-{owner.pk}/", f"s3://user-{owner.pk}-renamed/"):
        with pytest.raises(ObjectUrlError, match="is not yours"):
            Storage.reach_for(text, None, stranger.pk, stranger.username)


def test_one_users_keys_are_never_used_for_another_user(owner, stranger):
    storage = a_storage()
    UserStoreKeys.keep(owner, storage, TEAM_ACCESS_KEY, TEAM_SECRET_KEY)

    with pytest.raises(ObjectUrlError, match="add your own keys"):
        Storage.reach_for(f"s3://{TEAM_BUCKET}/mnist/", None, stranger.pk, stranger.username)


class TakingUsersKeys(FakeStorage):
    users_may_bring_keys = True


def test_the_access_rules_take_the_users_keys_as_plain_values_and_keep_them_out_of_any_repr():
    own = StoreAccess("http://127.0.0.1:9", TEAM_ACCESS_KEY, TEAM_SECRET_KEY)

    where = reach(f"s3://{TEAM_BUCKET}/a/", TakingUsersKeys(), 3, "alice", own)

    assert where.store.access is own
    assert TEAM_ACCESS_KEY not in repr(where) and TEAM_SECRET_KEY not in repr(where)
    assert reach("s3://user-3-alice/a/", TakingUsersKeys(), 3, "alice", own).store.access.access_key == "access"


# The form.

@pytest.mark.parametrize(("field", "value", "words"), [
    ("access_key", "AK", "3 to 128 letters"),
    ("access_key", "AK TEAM", "3 to 128 letters"),
    ("access_key", "AKTE\nAM", "3 to 128 letters"),
    ("access_key", "AKÉTEAM", "3 to 128 letters"),
    ("access_key", "A" * 129, "at most 128 characters"),
    ("secret_key", "short", "8 to 256 printable characters"),
    ("secret_key", "has a space inside", "8 to 256 printable characters"),
    ("secret_key", "tab\there-secret", "8 to 256 printable characters"),
    ("bucket", "Team_Datasets", "3 to 63 lower-case letters"),
    ("bucket", "ab", "3 to 63 lower-case letters"),
])
def test_the_form_refuses_what_cannot_be_a_key_or_a_bucket_saying_why(field, value, words):
    data = {"access_key": TEAM_ACCESS_KEY, "secret_key": TEAM_SECRET_KEY, "bucket": TEAM_BUCKET, field: value}

    form = StoreKeysForm(data)

    assert not form.is_valid() and words in " ".join(form.errors[field]), form.errors


def test_the_form_takes_keys_as_the_stores_hand_them_out():
    form = StoreKeysForm({"access_key": "AKIAIOSFODNN7EXAMPLE", "secret_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                          "bucket": "team.datasets-1"})

    assert form.is_valid(), form.errors


# The page.

def keys_form(storage: Storage, **fields: str) -> dict[str, str]:
    values = {"access_key": TEAM_ACCESS_KEY, "secret_key": TEAM_SECRET_KEY, "bucket": TEAM_BUCKET, **fields}
    return {f"store-{storage.pk}-{name}": value for name, value in values.items()}


def shows_any_part_of_the_keys(content: bytes) -> bool:
    text = content.decode()
    return any(key[start:start + 6] in text for key in (TEAM_ACCESS_KEY, TEAM_SECRET_KEY)
               for start in range(len(key) - 5))


def test_a_user_sets_keys_the_store_takes_and_the_page_says_only_when(client, owner, gateway):
    endpoint, server = gateway
    storage = a_storage(endpoint=endpoint)
    client.force_login(owner)

    answer = client.post(f"/store-keys/{storage.pk}", keys_form(storage), follow=True)

    assert answer.status_code == 200 and asked(server) == [(TEAM_ACCESS_KEY, f"/{TEAM_BUCKET}")]
    kept = UserStoreKeys.objects.get(user=owner, storage=storage)
    assert (kept.access().access_key, kept.access().secret_key) == (TEAM_ACCESS_KEY, TEAM_SECRET_KEY)
    page = client.get("/store-keys")
    assert f"Your keys: set on {localtime(kept.set_at):%Y-%m-%d %H:%M}" in page.content.decode() and "Replace my keys" in page.content.decode()
    assert page["Cache-Control"] == "no-store"
    assert not shows_any_part_of_the_keys(answer.content) and not shows_any_part_of_the_keys(page.content)


def test_a_user_replaces_then_removes_their_keys(client, owner, gateway):
    endpoint, _server = gateway
    storage = a_storage(endpoint=endpoint)
    UserStoreKeys.keep(owner, storage, "AKOLDKEY0001", "old-secret-value")
    client.force_login(owner)

    client.post(f"/store-keys/{storage.pk}", keys_form(storage))
    assert UserStoreKeys.objects.get(user=owner, storage=storage).access().access_key == TEAM_ACCESS_KEY

    assert client.post(f"/store-keys/{storage.pk}/remove").status_code == 302
    assert not UserStoreKeys.objects.filter(user=owner).exists()
    assert "No keys of yours." in client.get("/store-keys").content.decode()


def test_removing_keys_that_queued_jobs_reach_another_bucket_with_names_those_jobs_before_and_after(
        client, owner, make_job):
    storage = a_storage()
    UserStoreKeys.keep(owner, storage, TEAM_ACCESS_KEY, TEAM_SECRET_KEY)
    own = storage.user_bucket(owner.pk, owner.get_username())
    needs = make_job(owner=owner, parameters=[{"name": "data_url", "value": f"s3://{TEAM_BUCKET}/images/"}])
    make_job(owner=owner, parameters=[{"name": "train_url", "value": f"s3://{own}/runs/1/"}])  # its own bucket
    make_job(owner=owner, status="Completed", parameters=[{"name": "data_url", "value": f"s3://{TEAM_BUCKET}/x/"}])
    client.force_login(owner)

    page = client.get("/store-keys").content.decode()
    assert f"Your job(s) #{needs.pk}, queued or running, reach another bucket of this store" in page
    answer = client.post(f"/store-keys/{storage.pk}/remove", follow=True).content.decode()
    assert f"Job(s) #{needs.pk} reach another bucket of that store with them" in answer


@pytest.mark.parametrize(("fields", "words"), [
    ({"access_key": "AKUNKNOWN0001"}, "The team store did not take these keys: bucket team-datasets: the store refused the keys."),
    ({"bucket": "no-such-bucket"}, "The team store has no bucket no-such-bucket."),
])
def test_keys_the_store_refuses_are_not_kept_and_the_page_says_why(client, owner, gateway, fields, words):
    endpoint, _server = gateway
    storage = a_storage(endpoint=endpoint)
    client.force_login(owner)

    answer = client.post(f"/store-keys/{storage.pk}", keys_form(storage, **fields))

    assert answer.status_code == 200 and words in answer.content.decode()
    assert not UserStoreKeys.objects.exists()
    assert not shows_any_part_of_the_keys(answer.content), "a form shown again is empty of keys"


def test_a_store_that_does_not_answer_is_said_in_words_not_a_server_error(client, owner):
    storage = a_storage(endpoint="http://127.0.0.1:9")
    client.force_login(owner)

    answer = client.post(f"/store-keys/{storage.pk}", keys_form(storage))

    assert answer.status_code == 200 and "The object store did not answer" in answer.content.decode()
    assert not UserStoreKeys.objects.exists()


def test_a_store_that_takes_no_users_keys_is_not_offered_and_refuses_them(client, owner):
    storage = a_storage(users_may_bring_keys=False)
    client.force_login(owner)

    assert "No object store of this console takes users' own keys." in client.get("/store-keys").content.decode()
    assert client.post(f"/store-keys/{storage.pk}", keys_form(storage)).status_code == 404
    assert not UserStoreKeys.objects.exists()


def test_another_user_neither_sees_nor_changes_nor_removes_someones_keys(client, owner, stranger, gateway):
    endpoint, _server = gateway
    storage = a_storage(endpoint=endpoint)
    kept = UserStoreKeys.keep(owner, storage, TEAM_ACCESS_KEY, TEAM_SECRET_KEY)
    client.force_login(stranger)

    page = client.get("/store-keys")
    assert "No keys of yours." in page.content.decode() and "set on" not in page.content.decode()
    assert client.post(f"/store-keys/{storage.pk}/remove").status_code == 404
    client.post(f"/store-keys/{storage.pk}", keys_form(storage))

    owners = UserStoreKeys.objects.get(pk=kept.pk)
    assert (owners.sealed_access_key, owners.sealed_secret_key, owners.set_at) == (
        kept.sealed_access_key, kept.sealed_secret_key, kept.set_at)
    assert UserStoreKeys.objects.filter(user=stranger).count() == 1


def test_a_visitor_is_sent_to_sign_in_and_keeps_nothing(client):
    storage = a_storage()
    for answer in (client.get("/store-keys"), client.post(f"/store-keys/{storage.pk}", keys_form(storage)),
                   client.post(f"/store-keys/{storage.pk}/remove")):
        assert answer.status_code == 302 and "/accounts/login/" in answer["Location"]
    assert not UserStoreKeys.objects.exists()


# How they are kept.

def test_the_keys_are_sealed_in_the_database(owner):
    storage = a_storage()
    UserStoreKeys.keep(owner, storage, TEAM_ACCESS_KEY, TEAM_SECRET_KEY)

    with connection.cursor() as cursor:
        cursor.execute("SELECT sealed_access_key, sealed_secret_key FROM jobs_userstorekeys")
        [(access, secret)] = cursor.fetchall()

    assert TEAM_ACCESS_KEY not in access + secret and TEAM_SECRET_KEY not in access + secret
    assert (open_secret(access), open_secret(secret)) == (TEAM_ACCESS_KEY, TEAM_SECRET_KEY)
    assert TEAM_ACCESS_KEY not in str(UserStoreKeys.objects.get()), "nor in its name"


def test_the_admin_lists_who_keeps_keys_and_may_delete_them_but_never_shows_or_changes_them(owner):
    storage = a_storage()
    kept = UserStoreKeys.keep(owner, storage, TEAM_ACCESS_KEY, TEAM_SECRET_KEY)
    admin = Client()
    admin.force_login(person("root-admin", is_staff=True, is_superuser=True))

    listing = admin.get("/admin/jobs/userstorekeys/")
    detail = admin.get(f"/admin/jobs/userstorekeys/{kept.pk}/change/")
    admin.post(f"/admin/jobs/userstorekeys/{kept.pk}/change/", {"user": owner.pk, "storage": storage.pk})

    assert listing.status_code == detail.status_code == 200 and "owner" in listing.content.decode()
    for page in (listing, detail):
        assert not shows_any_part_of_the_keys(page.content) and kept.sealed_secret_key not in page.content.decode()
    assert b'name="access_key"' not in detail.content and admin.get("/admin/jobs/userstorekeys/add/").status_code == 403
    assert UserStoreKeys.objects.get(pk=kept.pk).sealed_secret_key == kept.sealed_secret_key

    admin.post(f"/admin/jobs/userstorekeys/{kept.pk}/delete/", {"post": "yes"})
    assert not UserStoreKeys.objects.exists()


def test_the_admin_lets_a_store_take_users_keys():
    storage = a_storage(users_may_bring_keys=False)
    admin = Client()
    admin.force_login(person("root-admin", is_staff=True, is_superuser=True))

    page = admin.get(f"/admin/jobs/storage/{storage.pk}/change/").content.decode()

    assert 'name="users_may_bring_keys"' in page


def test_the_data_browser_says_a_bucket_reached_with_ones_keys_does_not_exist_rather_than_showing_it_empty(
        owner, gateway):
    from tests.fixtures import api_client

    endpoint, _server = gateway
    storage = a_storage(endpoint=endpoint)
    storage.schemes = "s3"
    storage.save()
    UserStoreKeys.keep(owner, storage, TEAM_ACCESS_KEY, TEAM_SECRET_KEY)

    answer = api_client(owner).get("/api/v1/data", {"url": "s3://nope-nope/"})

    assert answer.status_code == 400, answer.content
    assert answer.json()["url"] == ["The team store has no bucket nope-nope."]
