"""The job list as a reader orders and searches it: any column, a final metric, a job's #id, and a clear word
for a state or an order the list does not know."""

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from jobs.models import JobStatus, TrainingJob

pytestmark = pytest.mark.django_db


@pytest.fixture
def pages(owner) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def names_in_order(pages: Client, query: str) -> list[str]:
    page = pages.get(f"/?{query}").content.decode()
    return re.findall(r'<a href="/jobs/\d+">([^<]+)</a>', page)


@pytest.fixture
def three_jobs(make_job):
    now = timezone.now()
    jobs = {
        "bravo": make_job(name="bravo", status=JobStatus.COMPLETED, final_metrics={"loss": 0.5, "accuracy": 0.7}),
        "alpha": make_job(name="alpha", status=JobStatus.FAILED, final_metrics={"loss": 0.2}),
        "charlie": make_job(name="charlie", status=JobStatus.PENDING),
    }
    TrainingJob.objects.filter(pk=jobs["bravo"].pk).update(
        created_at=now - timedelta(hours=3), started_at=now - timedelta(hours=3), ended_at=now - timedelta(hours=1))
    TrainingJob.objects.filter(pk=jobs["alpha"].pk).update(
        created_at=now - timedelta(hours=2), started_at=now - timedelta(minutes=50), ended_at=now - timedelta(minutes=40))
    TrainingJob.objects.filter(pk=jobs["charlie"].pk).update(created_at=now - timedelta(hours=1))
    return jobs


def test_the_list_is_newest_first_and_orders_by_the_column_a_reader_clicks_either_way(pages, three_jobs):
    assert names_in_order(pages, "") == ["charlie", "alpha", "bravo"]
    assert names_in_order(pages, "sort=name") == ["alpha", "bravo", "charlie"]
    assert names_in_order(pages, "sort=-name") == ["charlie", "bravo", "alpha"]
    assert names_in_order(pages, "sort=created") == ["bravo", "alpha", "charlie"]
    assert names_in_order(pages, "sort=state") == ["bravo", "alpha", "charlie"]  # Completed, Failed, Pending
    # The longest first; a job that never started comes last either way.
    assert names_in_order(pages, "sort=-duration") == ["bravo", "alpha", "charlie"]
    assert names_in_order(pages, "sort=duration") == ["alpha", "bravo", "charlie"]


def test_a_final_metric_orders_the_list_and_jobs_without_it_come_last(pages, three_jobs):
    assert names_in_order(pages, "sort=metric:loss") == ["alpha", "bravo", "charlie"]
    assert names_in_order(pages, "sort=-metric:loss") == ["bravo", "alpha", "charlie"]
    page = pages.get("/?sort=metric:loss").content.decode()
    # The Metrics header offers each metric of the page's jobs; the current one's link reverses it.
    assert 'sort=-metric%3Aloss' in page and 'sort=metric%3Aaccuracy' in page


def test_the_headers_link_to_their_order_and_keep_the_filters(pages, three_jobs):
    page = pages.get("/?state=Completed&sort=name").content.decode()
    assert 'aria-sort="ascending"' in page and '?state=Completed&amp;sort=-name' in page
    assert '?state=Completed&amp;sort=-created' in page  # another column: newest first
    assert '<input type="hidden" name="sort" value="name">' in page  # the filters' form keeps the order


def test_a_job_is_found_by_its_hash_id_as_well_as_by_name(pages, three_jobs, make_job):
    alpha = three_jobs["alpha"]
    assert names_in_order(pages, f"q=%23{alpha.pk}") == ["alpha"]
    assert names_in_order(pages, f"q={alpha.pk}") == ["alpha"]
    numbered = make_job(name=f"run-{alpha.pk}")
    assert set(names_in_order(pages, f"q={alpha.pk}")) == {"alpha", numbered.name}


def test_an_unknown_state_or_order_is_said_on_the_list_and_the_other_filters_still_apply(pages, three_jobs):
    answer = pages.get("/?state=Nope&q=alp")
    page = answer.content.decode()
    assert answer.status_code == 200
    assert "There is no state Nope; the states are" in page and "Completed" in page
    assert names_in_order(pages, "state=Nope&q=alp") == ["alpha"]
    answer = pages.get("/?sort=owner;drop")
    assert answer.status_code == 200
    assert "The list cannot be ordered by owner;drop" in answer.content.decode()
    assert names_in_order(pages, "sort=owner;drop") == ["charlie", "alpha", "bravo"]


def test_the_form_carries_none_of_the_users_job_names_and_asks_whether_one_is_taken(pages, make_job, owner, stranger):
    make_job(owner=owner, name="secret-project-x")
    make_job(owner=stranger, name="strangers-run")
    assert "secret-project-x" not in pages.get("/jobs/new").content.decode()
    assert pages.get("/jobs/name-taken", {"name": " secret-project-x "}).json() == {"taken": True}
    assert pages.get("/jobs/name-taken", {"name": "strangers-run"}).json() == {"taken": False}  # not the user's
    assert pages.get("/jobs/name-taken", {"name": ""}).json() == {"taken": False}


def test_the_admin_is_titled_as_the_console_and_favicon_ico_is_its_icon(admin_client):
    index = admin_client.get("/admin/").content.decode()
    assert "Training Console administration" in index and "Django administration" not in index
    answer = admin_client.get("/favicon.ico")
    assert answer.status_code == 301 and answer["Location"].endswith("favicon.svg")


def test_metric_names_with_a_colon_or_a_double_underscore_order_the_list_too(pages, make_job):
    make_job(name="low", final_metrics={"eval:loss": 0.1, "a__b": 2.0})
    make_job(name="high", final_metrics={"eval:loss": 0.9, "a__b": 1.0})
    assert names_in_order(pages, "sort=metric:eval:loss") == ["low", "high"]
    assert names_in_order(pages, "sort=metric:a__b") == ["high", "low"]
    assert "cannot be ordered" not in pages.get("/?sort=-metric:eval:loss").content.decode()
