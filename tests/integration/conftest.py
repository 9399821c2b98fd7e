"""The integration tests' marker and their users; their services (Redis, Celery, the local cluster) are in tests/conftest.py."""

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient


def pytest_collection_modifyitems(items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def owner(console):
    return get_user_model().objects.create_user("owner", password="owner-password")


@pytest.fixture
def api(owner):
    """The owner's API client, as a token-holding script would use it."""
    client = APIClient()
    client.force_authenticate(owner)
    return client
