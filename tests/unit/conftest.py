"""The unit tests' shared fixtures: the people (owner, teammate, stranger, staff), the make_job factory, the
owner's API client and token, and the catalogue a submission names."""

import pytest

from tests.fixtures import api, catalogue, make_job, owner, staff, stranger, teammate, token  # noqa: F401 - fixtures, found by name


@pytest.fixture(autouse=True)
def language_of_each_test_its_own():
    """A request made in another language leaves it active in the thread (LocaleMiddleware activates it and
    nothing deactivates it): each test starts, and leaves the next one, in the default language."""
    from django.utils import translation

    translation.deactivate()
    yield
    translation.deactivate()


@pytest.fixture(autouse=True)
def cache_of_each_test_its_own():
    """Django's cache holds the bad-token counts and the known tokens per address: one test's guesses must
    not lock the next one's client out."""
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()
