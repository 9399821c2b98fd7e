"""The API tokens page: a user makes a named token, sees it once, and revokes it; nobody else's is in reach."""

import pytest

from jobs.models import ApiToken

pytestmark = pytest.mark.django_db


def test_a_user_makes_a_token_sees_it_once_and_it_opens_the_api(client, owner):
    client.force_login(owner)
    made = client.post("/tokens", {"name": "laptop"})
    token = made.context["new_token"]
    assert made.status_code == 200 and token.startswith("tc_") and token in made.content.decode()
    assert made["Cache-Control"] == "no-store"
    again = client.get("/tokens").content.decode()
    assert "laptop" in again and token not in again, "shown once, never again"
    client.logout()
    assert client.get("/api/v1/training-jobs", HTTP_AUTHORIZATION=f"Token {token}").status_code == 200


def test_a_token_name_is_required_and_unique_per_user(client, owner):
    client.force_login(owner)
    client.post("/tokens", {"name": "ci"})
    answer = client.post("/tokens", {"name": "ci"})
    assert "already have a token of that name" in answer.content.decode()
    assert ApiToken.objects.filter(user=owner).count() == 1


def test_a_revoked_token_no_longer_opens_the_api(client, owner):
    record, token = ApiToken.issue(owner, "old")
    client.force_login(owner)
    assert client.post(f"/tokens/{record.pk}/revoke").status_code == 302
    client.logout()
    assert client.get("/api/v1/training-jobs", HTTP_AUTHORIZATION=f"Token {token}").status_code == 401


def test_a_stranger_cannot_see_or_revoke_the_owners_tokens(client, owner, stranger):
    record, _token = ApiToken.issue(owner, "owners-laptop")
    client.force_login(stranger)
    assert "owners-laptop" not in client.get("/tokens").content.decode()
    assert client.post(f"/tokens/{record.pk}/revoke").status_code == 404
    assert ApiToken.objects.filter(pk=record.pk).exists()


def test_the_tokens_page_asks_a_visitor_to_log_in(client):
    assert client.get("/tokens").status_code == 302
