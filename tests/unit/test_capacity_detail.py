"""The capacity page as a waiting user reads it: which job holds each node (others' by number only), who waits in
which order, and when each may start from the auto stops of the jobs on the nodes it needs."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from jobs.models import JobStatus, Node, TrainingJob
from jobs.pages.capacity_detail import waiting_words
from tests.fixtures import add_nodes, cpu_spec

pytestmark = pytest.mark.django_db


def page_of(user) -> str:
    client = Client()
    client.force_login(user)
    return client.get("/capacity").content.decode()


@pytest.fixture
def busy_pool(make_job, owner, stranger):
    """Two nodes held by the stranger's job (auto stop in 2 h, started 1 h ago), the owner's job waiting for both."""
    nodes = add_nodes(cpu_spec(), 2)
    holder = make_job(owner=stranger, name="strangers-secret-run", status=JobStatus.RUNNING, auto_stop_hours=2,
                      started_at=timezone.now() - timedelta(hours=1))
    Node.objects.filter(pk__in=[node.pk for node in nodes]).update(allocated_to=holder)
    waiting = make_job(owner=owner, name="my-waiting-run")
    return holder, waiting


def test_a_waiting_user_sees_who_holds_each_node_by_number_and_when_their_own_job_may_start(busy_pool, owner):
    holder, waiting = busy_pool
    page = page_of(owner)
    assert f"#{holder.pk}, another user's job" in page and "strangers-secret-run" not in page
    assert "my-waiting-run" in page and f'href="/jobs/{waiting.pk}"' in page
    end = timezone.localtime(holder.started_at + timedelta(hours=2)).strftime("%Y-%m-%d %H:%M")
    assert f"its nodes are sure to be free by about {end}" in page


def test_staff_who_see_every_job_get_the_holders_name_and_owner(busy_pool, staff):
    from django.contrib.auth.models import Permission

    staff.user_permissions.add(Permission.objects.get(codename="view_trainingjob"))
    page = page_of(staff)
    assert "strangers-secret-run" in page and "stranger" in page


def test_a_holder_without_an_auto_stop_makes_the_start_unknown_and_free_nodes_make_it_now(busy_pool, owner):
    holder, waiting = busy_pool
    TrainingJob.objects.filter(pk=holder.pk).update(auto_stop_hours=None)
    assert "unknown: a job on the nodes it needs has no auto stop limit" in page_of(owner)
    Node.objects.update(allocated_to=None)
    assert "its nodes are free: it starts at the next dispatch" in page_of(owner)


def test_the_jobs_ahead_are_said_in_words():
    now = timezone.now()
    assert waiting_words(now - timedelta(seconds=1), 2, now) == "enough nodes are free; 2 job(s) ahead of it go first"
    assert waiting_words(now, 0, now, free_slots=0) == (
        "its nodes are free; it waits for a run slot (every worker thread runs a job)")
    later = waiting_words(now + timedelta(hours=1), 1, now)
    assert later.startswith("its nodes are sure to be free by about") and later.endswith("1 job(s) ahead of it go first.")
