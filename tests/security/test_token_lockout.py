"""Token guessing from one address is stopped without locking out the others who share that address."""

import pytest
from rest_framework.test import APIClient

from jobs.models import ApiToken
from tests.fixtures import person

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/training-jobs"


@pytest.mark.attack("a client sends bad API tokens until the lockout, from the address every local client shares",
                    "guessing is refused; the other users' tokens in use still work")
def test_a_guesser_cannot_lock_the_users_who_share_its_address_out(settings):
    settings.API_TOKEN_FAILURE_LIMIT = 10
    colleagues = [ApiToken.issue(person(f"colleague{index}"), "cli")[1] for index in range(3)]
    for token in colleagues:
        assert APIClient().get(JOBS, HTTP_AUTHORIZATION=f"Token {token}").status_code == 200

    for attempt in range(settings.API_TOKEN_FAILURE_LIMIT + 5):
        APIClient().get(JOBS, HTTP_AUTHORIZATION=f"Token tc_guess{attempt}")

    assert APIClient().get(JOBS, HTTP_AUTHORIZATION="Token tc_guess-more").status_code == 429
    for token in colleagues:
        assert APIClient().get(JOBS, HTTP_AUTHORIZATION=f"Token {token}").status_code == 200


def test_a_locked_out_address_does_not_look_at_new_tokens_so_guessing_learns_nothing(settings, owner):
    settings.API_TOKEN_FAILURE_LIMIT = 3
    never_used_here = ApiToken.issue(owner, "fresh")[1]
    for attempt in range(3):
        APIClient().get(JOBS, HTTP_AUTHORIZATION=f"Token tc_guess{attempt}")

    right = APIClient().get(JOBS, HTTP_AUTHORIZATION=f"Token {never_used_here}")
    wrong = APIClient().get(JOBS, HTTP_AUTHORIZATION="Token tc_wrong")

    assert right.status_code == wrong.status_code == 429
    assert right.json() == wrong.json()
