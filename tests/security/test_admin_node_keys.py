"""The back office never shows a node's root login key, and its node actions need the change permission.

A node's private key logs in as root on that node: it is written once and only its public half and
fingerprint are shown back, whoever looks (a viewer, an editor, a superuser)."""

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.contrib.auth.models import Permission
from django.test import Client

from jobs.models import Node, ResourceSpec
from jobs.node_keys import fingerprint, public_line_of
from tests.fixtures import person

pytestmark = pytest.mark.django_db


def private_key_text() -> str:
    key = Ed25519PrivateKey.generate()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                             serialization.NoEncryption()).decode()


@pytest.fixture
def node_key() -> str:
    return private_key_text()


@pytest.fixture
def node(node_key) -> Node:
    spec = ResourceSpec.objects.create(name="cpu-key-test", cpu_cores=2, memory_gb=4, cpu_slots_per_node=2)
    node = Node(name="node-with-root-key", address="10.9.0.1", spec=spec)
    node.private_key = node_key
    node.save()
    return node


def staff_with(username: str, *codenames: str) -> Client:
    user = person(username, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="jobs", codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def key_body_lines(key: str) -> list[str]:
    return [line for line in key.splitlines() if line and not line.startswith("-----")]


def shows_any_part_of(content: bytes, key: str) -> bool:
    return any(line.encode() in content for line in key_body_lines(key))


@pytest.mark.attack("staff with only view_node opens a node's admin page", "no part of the root private key is shown")
def test_a_node_viewer_sees_the_public_key_and_fingerprint_but_never_the_private_key(node, node_key):
    viewer = staff_with("node-viewer", "view_node")

    response = viewer.get(f"/admin/jobs/node/{node.pk}/change/")

    assert response.status_code == 200
    assert not shows_any_part_of(response.content, node_key)
    public = public_line_of(node_key)
    assert public.encode() in response.content and fingerprint(public).encode() in response.content


@pytest.mark.parametrize("who", ["editor", "superuser"])
def test_who_may_change_a_node_still_never_gets_its_private_key_back(node, node_key, who):
    if who == "editor":
        client = staff_with("node-editor", "view_node", "change_node")
    else:
        client = Client()
        client.force_login(person("root-admin", is_staff=True, is_superuser=True))

    response = client.get(f"/admin/jobs/node/{node.pk}/change/")

    assert response.status_code == 200
    assert b'name="private_key"' in response.content  # the write-only field, empty
    assert not shows_any_part_of(response.content, node_key)
    assert fingerprint(public_line_of(node_key)).encode() in response.content


@pytest.mark.attack("staff with only view_node posts the node actions (check, drain, enable, force release)",
                    "none is offered and none takes effect")
@pytest.mark.parametrize("action", ["check_now", "drain", "enable", "force_release"])
def test_a_node_viewer_is_offered_no_node_action_and_cannot_post_one(node, action):
    Node.objects.filter(pk=node.pk).update(enabled=False)
    viewer = staff_with("node-viewer", "view_node")

    listing = viewer.get("/admin/jobs/node/")
    posted = viewer.post("/admin/jobs/node/", {"action": action, "_selected_action": [str(node.pk)],
                                               "confirmed": "yes"})

    assert listing.status_code == 200 and f'value="{action}"'.encode() not in listing.content
    assert posted.status_code in (200, 302, 403)
    after = Node.objects.get(pk=node.pk)
    assert (after.enabled, after.draining, after.last_checked_at) == (False, False, None)


def test_an_editor_may_drain_a_node(node):
    editor = staff_with("node-editor", "view_node", "change_node")

    editor.post("/admin/jobs/node/", {"action": "drain", "_selected_action": [str(node.pk)]})

    assert Node.objects.get(pk=node.pk).draining
