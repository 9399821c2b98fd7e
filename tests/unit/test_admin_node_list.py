"""The node list's badges are styled by classes from a stylesheet: the Content-Security-Policy allows no inline
style, so an inline colour would be dropped by the browser."""

import pytest
from django.test import Client

from jobs.models import Node, ResourceSpec
from tests.fixtures import person

pytestmark = pytest.mark.django_db


def test_the_node_list_colours_its_states_with_classes_of_its_own_stylesheet():
    spec = ResourceSpec.objects.create(name="cpu-list", cpu_cores=1, memory_gb=1)
    Node.objects.create(name="listed", address="10.9.0.1", spec=spec)
    client = Client()
    client.force_login(person("root-admin", is_staff=True, is_superuser=True))

    page = client.get("/admin/jobs/node/").content.decode()

    assert 'class="node-state node-state-' in page
    assert "admin_console/nodes.css" in page
    assert 'style="color' not in page
