"""An object-store input too large for the nodes a job may run on is refused where its URL was typed, before the
job takes any node: the nodes' disks come from their health checks, the input's size from the store's listing
(faked here at its HTTP boundary; the store itself is in tests/integration/test_object_storage.py)."""

import pytest

from jobs.node_facts import parse_facts
from jobs.object_store.client import StoredObject, StoreError
from jobs.object_store.urls import parse_object_url
from jobs.submission import object_urls
from jobs.submission.object_urls import InputRoom, input_room, object_url_problem

GB = 1024**3


def test_the_room_is_the_smallest_disk_of_the_best_nodes_the_job_needs_less_the_nodes_reserve(settings):
    settings.NODE_DISK_RESERVE_GB = 5
    nodes = [{"disk_total_bytes": 100 * GB}, {"disk_total_bytes": 50 * GB}, {"disk_total_bytes": 10 * GB}, {}, None]
    assert input_room(nodes, 1) == InputRoom(95 * GB, 5 * GB)
    assert input_room(nodes, 2) == InputRoom(45 * GB, 5 * GB)
    assert input_room(nodes, 3) == InputRoom(5 * GB, 5 * GB)
    assert input_room(nodes, 4) is None, "a node that reported nothing is not held against the job"
    assert input_room([{"disk_total_bytes": 2 * GB}], 1) == InputRoom(0, 5 * GB)
    assert input_room([{"disk_total_bytes": "lots"}], 1) is None


def test_a_nodes_check_reports_its_work_disks_size_and_free_space():
    facts = parse_facts("@@ cpu\n4\n@@ disk\n107374182400 53687091200\n", [])
    assert (facts["disk_total_bytes"], facts["disk_free_bytes"]) == (100 * GB, 50 * GB)
    assert parse_facts("@@ disk\nsoon never\n", [])["disk_total_bytes"] is None
    assert parse_facts("@@ cpu\n4\n", [])["disk_free_bytes"] is None


class ListedStore:
    """The store's side of the submission's listing."""

    def __init__(self, sizes: list[int], refuse: str = ""):
        self.sizes, self.refuse = sizes, refuse

    def bucket_exists(self, bucket):
        return True

    def objects(self, bucket, prefix, limit):
        if self.refuse:
            raise StoreError(self.refuse)
        return iter([StoredObject(f"{prefix}{index}.bin", size, "etag") for index, size in enumerate(self.sizes)])

    def has_any(self, bucket, prefix):
        return bool(self.sizes)


@pytest.fixture
def store_with(monkeypatch):
    def listing(sizes: list[int], refuse: str = ""):
        def reach_for(text, pool_id, user_id, username):
            from jobs.object_store.access import Reach

            return Reach(parse_object_url(text), ListedStore(sizes, refuse), "local", "http://store")
        monkeypatch.setattr(object_urls.Storage, "reach_for", reach_for)
    return listing


def test_an_input_larger_than_the_nodes_can_hold_is_refused_saying_both_sizes(store_with):
    store_with([30 * GB, 30 * GB])
    problem = object_url_problem("data_url", "s3://user-1-a/data/", 1, "a", None, InputRoom(45 * GB, 5 * GB))
    assert problem == ("s3://user-1-a/data/ holds 60.0 GB: more than the nodes this job may run on can hold "
                       "(45.0 GB each, keeping 5.0 GB for the node itself).")
    assert object_url_problem("data_url", "s3://user-1-a/data/", 1, "a", None, InputRoom(60 * GB, 5 * GB)) == ""
    assert object_url_problem("data_url", "s3://user-1-a/data/", 1, "a", None, None) == "", "no room known: taken"


def test_an_input_of_more_objects_than_a_run_fetches_or_nothing_at_all_is_refused_in_words(store_with):
    store_with([], refuse="s3://user-1-a/data/ holds more than 20000 objects.")
    assert object_url_problem("data_url", "s3://user-1-a/data/", 1, "a", None) == \
        "s3://user-1-a/data/ holds more than 20000 objects."
    store_with([])
    assert object_url_problem("data_url", "s3://user-1-a/data/", 1, "a", None) == "Nothing is stored under s3://user-1-a/data/."


def test_the_form_measures_the_room_on_the_nodes_of_the_jobs_spec_and_pool(store_with, api_submit):
    store_with([8 * GB])
    answer = api_submit(node_disks=[10 * GB, 6 * GB, 4 * GB, 2 * GB])
    assert answer.status_code == 400, answer.content
    assert answer.json() == {"data_url": ["s3://user-1-a/data/ holds 8.0 GB: more than the nodes this job may run on "
                                          "can hold (5.0 GB each, keeping 1.0 GB for the node itself)."]}
    assert api_submit(node_disks=[20 * GB, 20 * GB, 4 * GB, 2 * GB]).status_code == 201


def test_inputs_that_each_fit_but_not_together_are_refused_on_the_parameters_naming_them_all(store_with, api_submit):
    store_with([3 * GB])
    further = [{"name": "data_url_1", "value": "s3://user-1-a/more/"}, {"name": "data_url_2", "value": "s3://user-1-a/x/"}]
    answer = api_submit(node_disks=[20 * GB, 8 * GB, 4 * GB, 2 * GB], parameters=further)
    assert answer.status_code == 400, answer.content
    assert answer.json() == {"parameters": [
        "The inputs data_url, data_url_1, data_url_2 hold 9.0 GB together: more than the nodes this job may run on "
        "can hold (7.0 GB each, keeping 1.0 GB for the node itself)."]}
    assert api_submit(node_disks=[20 * GB, 8 * GB, 4 * GB, 2 * GB], parameters=further[:1]).status_code == 201


@pytest.fixture
def api_submit(db, catalogue, api, settings, django_capture_on_commit_callbacks):
    from jobs.models import Node
    from tests.fixtures import job_body

    settings.NODE_DISK_RESERVE_GB = 1

    def submit(node_disks: list[int], parameters: list[dict] | None = None):
        for node, size in zip(Node.objects.order_by("name"), node_disks, strict=True):
            Node.objects.filter(pk=node.pk).update(health={"disk_total_bytes": size})
        body = job_body(data_url="s3://user-1-a/data/", **({"parameters": parameters} if parameters else {}))
        with django_capture_on_commit_callbacks(execute=False):
            return api.post("/api/v1/training-jobs", body, format="json")
    return submit
