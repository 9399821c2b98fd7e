"""Comparing runs: a Rebuild records its source (the page's and the API's, the user's own only), the list shows
a job's family, and 2-10 jobs the user may see are compared on a page, in the API and with `tc compare`:
only what differs, secrets masked, final metrics and durations side by side, rank 0's series by default."""

from datetime import timedelta

import pytest
from django.utils import timezone
from training_console_cli.compare import comparison_text

from jobs.launch.masking import MASK
from jobs.models import EngineVersion, JobStatus, MetricPoint, TrainingJob
from jobs.pages.job_list import family_ids
from jobs.pages.run_diff import CompareIdsError, compare_ids, differing_rows, masked_rows, side_by_side
from tests.fixtures import api_client, job_body

pytestmark = pytest.mark.django_db


# The pure part: ids, differences, side by side.

def test_ids_are_read_from_commas_spaces_and_hashes_in_the_order_given_each_once():
    assert compare_ids(["3,5", "#8 5"]) == [3, 5, 8]


@pytest.mark.parametrize("given, words", [(["3"], "1 given"), ([",".join(map(str, range(1, 12)))], "11 given"),
                                          (["3,abc"], "abc is not a job id"), (["3,0"], "0 is not a job id"),
                                          (["3,²"], "² is not a job id"), (["3,٣4"], "٣4 is not a job id"),
                                          ([], "0 given")])
def test_too_few_too_many_or_a_word_that_is_not_an_id_is_refused_saying_why(given, words):
    with pytest.raises(CompareIdsError, match=words):
        compare_ids(given)


def test_only_the_settings_that_differ_are_rows_and_a_setting_one_run_lacks_differs():
    runs = [{"id": 1, "name": "a", "sections": {"parameters": {"lr": "0.1", "steps": "10"}, "engine": {"image": "x"}},
             "secrets": []},
            {"id": 2, "name": "b", "sections": {"parameters": {"lr": "0.2", "steps": "10", "seed": "1"},
                                                "engine": {"image": "x"}}, "secrets": []}]

    rows = differing_rows(runs)  # type: ignore[arg-type]

    assert rows == [{"section": "parameters", "key": "lr", "values": ["0.1", "0.2"]},
                    {"section": "parameters", "key": "seed", "values": [None, "1"]}]


def test_secrets_that_differ_are_a_row_that_numbers_each_distinct_value_and_shows_none():
    runs = [{"id": job, "name": str(job), "sections": {"environment": {"TOKEN": token}},
             "secrets": [("environment", "TOKEN")]} for job, token in ((1, "aaa"), (2, "bbb"), (3, "aaa"))]

    rows = masked_rows(differing_rows(runs), runs, "***")  # type: ignore[arg-type]

    assert rows == [{"section": "environment", "key": "TOKEN", "values": ["*** (1)", "*** (2)", "*** (1)"]}]


def test_a_reader_who_does_not_own_every_run_learns_nothing_of_their_secrets_not_even_whether_they_differ():
    runs = [{"id": job, "name": str(job), "sections": {"environment": {"TOKEN": token, "STEPS": steps}},
             "secrets": [("environment", "TOKEN")]} for job, token, steps in ((1, "aaa", "1"), (2, "bbb", "2"))]

    rows = masked_rows(differing_rows(runs), runs, "***", owns_all=False)  # type: ignore[arg-type]

    assert rows == [{"section": "environment", "key": "STEPS", "values": ["1", "2"]}]


def test_final_metrics_are_side_by_side_with_none_where_a_run_has_none_and_the_duration_last():
    assert side_by_side([{"loss": 0.5}, {"loss": 0.25, "acc": 0.9}], [60.0, None]) == [
        {"name": "loss", "values": [0.5, 0.25]}, {"name": "acc", "values": [None, 0.9]},
        {"name": "duration_seconds", "values": [60.0, None]}]


# A Rebuild records its source.

@pytest.fixture
def submitted(api, catalogue, django_capture_on_commit_callbacks):
    def post(body: dict, client=None):
        with django_capture_on_commit_callbacks(execute=False):
            return (client or api).post("/api/v1/training-jobs", body, format="json")
    return post


def test_a_rebuild_on_the_page_records_the_job_it_was_made_from(client, owner, catalogue, submitted):
    source = TrainingJob.objects.get(pk=submitted(job_body()).json()["id"])
    client.force_login(owner)
    version = EngineVersion.objects.get(version="local")

    response = client.post("/jobs/new", {
        "name": "train-1-copy", "engine": version.pk, "code_dir": "gpu-train", "boot_file": "train.py", "spec": "cpu",
        "node_count": 2, "param_name": ["lr"], "param_value": ["0.3"], "rebuild_of": source.pk})

    assert response.status_code == 302, response.content.decode()[:2000]
    copy = TrainingJob.objects.get(name="train-1-copy")
    assert copy.rebuilt_from_id == source.pk
    assert list(source.rebuilds.all()) == [copy]
    page = client.get(f"/jobs/{copy.pk}").content.decode()
    assert f'href="/jobs/{source.pk}"' in page and f"?ids={source.pk},{copy.pk}" in page


def test_the_api_takes_rebuilt_from_for_ones_own_job_and_refuses_anothers_on_that_field(submitted, stranger):
    source = submitted(job_body()).json()
    copy = submitted(job_body(name="train-2", rebuilt_from=source["id"]))
    refused = submitted(job_body(name="train-3", rebuilt_from=source["id"]), client=api_client(stranger))

    assert copy.status_code == 201 and copy.json()["rebuilt_from"] == source["id"]
    assert refused.status_code == 400 and "rebuilt_from" in refused.json()
    assert not TrainingJob.objects.filter(name="train-3").exists()


def test_a_family_is_the_root_and_every_rebuild_of_any_generation_and_the_list_shows_only_it(client, owner, make_job):
    root = make_job(name="root")
    child = make_job(name="child", rebuilt_from=root)
    grandchild = make_job(name="grandchild", rebuilt_from=child)
    cousin = make_job(name="cousin", rebuilt_from=root)
    make_job(name="unrelated")
    client.force_login(owner)

    page = client.get(f"/?family={grandchild.pk}").content.decode()

    assert family_ids(grandchild.pk) == {root.pk, child.pk, grandchild.pk, cousin.pk}
    assert "unrelated" not in page and all(name in page for name in ("root", "child", "grandchild", "cousin"))
    assert f'data-rebuild-of="{child.pk}"' in page


def test_the_api_lists_a_jobs_family_and_refuses_a_family_id_that_is_not_a_number(api, make_job):
    root = make_job(name="root")
    child = make_job(name="child", rebuilt_from=root)
    make_job(name="unrelated")

    listed = api.get(f"/api/v1/training-jobs?family={child.pk}")

    assert sorted(job["id"] for job in listed.json()["results"]) == [root.pk, child.pk]
    assert api.get("/api/v1/training-jobs?family=abc").status_code == 400


# The comparison.

def finished(make_job, name: str, lr: str, loss: float, **traits) -> TrainingJob:
    started = timezone.now() - timedelta(minutes=5)
    job = make_job(name=name, status=JobStatus.COMPLETED, started_at=started, ended_at=started + timedelta(seconds=90),
                   parameters=[{"name": "lr", "value": lr}, {"name": "steps", "value": "10"}],
                   env={"API_TOKEN": f"secret-{name}", "SAME": "1"}, final_metrics={"loss": loss}, **traits)
    for step in range(3):
        for rank in (0, 1):
            MetricPoint.objects.create(job=job, name="loss", rank=rank, step=step, value=loss + step + rank,
                                       at=timezone.now(), seq=step + 1)
    return job


def test_the_compare_page_shows_only_what_differs_with_secrets_masked_and_finals_side_by_side(client, owner, make_job):
    first, second = finished(make_job, "first", "0.1", 0.5), finished(make_job, "second", "0.2", 0.25)
    client.force_login(owner)

    response = client.get(f"/jobs/compare?ids={first.pk},{second.pk}")

    page = response.content.decode()
    assert response.status_code == 200
    assert 'data-key="lr"' in page and 'data-key="steps"' not in page and 'data-key="SAME"' not in page
    assert 'data-key="API_TOKEN"' in page and f"{MASK} (2)" in page
    assert "secret-first" not in page and "secret-second" not in page
    assert 'data-metric="loss"' in page and "0.25" in page and "0:01:30" in page


def test_the_api_compares_with_rank_0s_series_by_default_and_every_ranks_when_asked(api, owner, make_job):
    first, second = finished(make_job, "first", "0.1", 0.5), finished(make_job, "second", "0.2", 0.25)

    answer = api.get(f"/api/v1/training-jobs/compare?ids={first.pk},{second.pk}").json()
    every = api.get(f"/api/v1/training-jobs/compare?ids={first.pk},{second.pk}&rank=all").json()

    assert [run["id"] for run in answer["runs"]] == [first.pk, second.pk]
    assert {"section": "parameters", "key": "lr", "values": ["0.1", "0.2"]} in answer["differences"]
    assert all(MASK in value for row in answer["differences"] if row["key"] == "API_TOKEN" for value in row["values"])
    assert [(line["job"], line["rank"]) for line in answer["series"]] == [(first.pk, 0), (second.pk, 0)]
    assert answer["series"][1]["points"] == [[0.0, 0.25], [1.0, 1.25], [2.0, 2.25]]
    assert len(every["series"]) == 4
    assert "lr" in comparison_text(answer) and "0.25" in comparison_text(answer)


def test_anothers_job_bad_ids_or_too_many_are_a_clear_error_never_a_500(client, api, owner, stranger, make_job):
    mine, theirs = make_job(name="mine"), make_job(name="theirs", owner=stranger)
    client.force_login(owner)

    unseen = client.get(f"/jobs/compare?ids={mine.pk},{theirs.pk}")
    alone = client.get(f"/jobs/compare?ids={mine.pk}")
    api_unseen = api.get(f"/api/v1/training-jobs/compare?ids={mine.pk},{theirs.pk}")
    api_bad = api.get("/api/v1/training-jobs/compare?ids=1,x")
    api_rank = api.get(f"/api/v1/training-jobs/compare?ids={mine.pk},{mine.pk + 1}&rank=7")

    assert unseen.status_code == 404 and f"#{theirs.pk}" in unseen.content.decode() and "theirs" not in unseen.content.decode()
    assert alone.status_code == 400 and "1 given" in alone.content.decode()
    assert api_unseen.status_code == 404 and f"#{theirs.pk}" in api_unseen.json()["ids"][0]
    assert api_bad.status_code == 400 and "x is not a job id" in api_bad.json()["ids"][0]
    assert api_rank.status_code == 400 and "rank" in api_rank.json()


def test_tc_compare_shows_a_value_with_escape_sequences_as_their_escapes_on_one_line():
    answer = {"runs": [{"id": 1, "name": "a", "status": "Completed"}, {"id": 2, "name": "b\x1b[2J", "status": "Failed"}],
              "differences": [{"section": "environment", "key": "NOTE", "values": ["x\ny", "\x1b]0;owned\x07"]}],
              "finals": []}
    text = comparison_text(answer)
    assert "\x1b" not in text and "\x07" not in text and "x\\x0ay" in text and "\\x1b]0;owned\\x07" in text
    assert len(text.splitlines()) == 3


def test_a_long_series_is_compared_thinned_with_its_ends_and_its_spike(make_job):
    from jobs.pages.comparison import SERIES_MAX_POINTS, compared_series

    job = make_job(status=JobStatus.COMPLETED)
    values = [1.0] * 5000
    values[3210], values[-1] = 42.0, 0.5
    MetricPoint.objects.bulk_create(MetricPoint(job=job, name="loss", rank=0, step=step, value=value, seq=step + 1,
                                                at=timezone.now()) for step, value in enumerate(values))

    [series] = compared_series(job, every_rank=False)

    assert len(series["points"]) <= SERIES_MAX_POINTS
    assert series["points"][0] == [0.0, 1.0] and series["points"][-1] == [4999.0, 0.5]
    assert [3210.0, 42.0] in series["points"]
