"""Bad input never gives a 500: every refusal is JSON in the documented shape, and nothing bad is stored.

The shapes: `{"field": ["message", ...]}` for what is wrong with a field, `{"detail": "..."}` for the request
as a whole. Each class here was seen answering 500 (or ending a run Abnormal) before it was refused.
"""

import json

import pytest
from django.test import AsyncClient, Client
from hypothesis import HealthCheck, event, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from jobs.logs import store as log_store
from jobs.logs.store import LogRecord
from jobs.models import JobStatus, LogStream, TrainingJob
from tests.fixtures import job_body
from tests.unit.log_helpers import quiet_redis, rank_line, store, system_line  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet_redis")]

JOBS = "/api/v1/training-jobs"
HUGE = str(10**30)


def post_raw(api, body: str | bytes, content_type: str = "application/json", path: str = JOBS):
    return api.generic("POST", path, body, content_type=content_type)


def assert_json_error(response, status: int | tuple[int, ...]) -> dict:
    statuses = status if isinstance(status, tuple) else (status,)
    assert response.status_code in statuses, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = json.loads(response.content)
    assert isinstance(body, dict) and body
    if "detail" in body:
        assert isinstance(body["detail"], str)
    else:
        assert all(isinstance(messages, list) and all(isinstance(m, str) for m in messages) for messages in body.values()), body
    return body


# A body that is not a JSON object.

@pytest.mark.parametrize("body", ["null", "[1]", '"x"', "1", "true", "[]", "1.5", '[{"name": "x"}]'])
def test_a_json_body_that_is_not_an_object_is_refused(api, catalogue, body):
    body_seen = assert_json_error(post_raw(api, body), 400)
    assert "detail" in body_seen
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("body", ["", "{", "{'name': 1}", "NaN", '{"node_count": Infinity}', "\x00", b"\xff\xfe{}"])
def test_a_body_that_is_not_json_is_refused(api, catalogue, body):
    assert_json_error(post_raw(api, body), 400)


@pytest.mark.parametrize("depth", [10_000, 100_000])
def test_deep_nesting_is_refused(api, catalogue, depth):
    assert_json_error(post_raw(api, "[" * depth + "]" * depth), 400)
    nested = '{"name": "x", "parameters": ' + "[" * depth + "]" * depth + "}"
    assert_json_error(post_raw(api, nested), 400)
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("depth", [33, 500])
def test_nesting_past_the_limit_is_an_error_naming_the_field(api, catalogue, depth):
    body = '{"name": "x", "parameters": ' + "[" * depth + "]" * depth + "}"
    assert "parameters" in assert_json_error(post_raw(api, body), 400)


def test_nesting_within_the_limit_reaches_the_form_and_is_a_field_error(api, catalogue):
    deep = "[" * 20 + "]" * 20
    body = f'{{"name": "x", "parameters": {deep}, "env": {deep}, "metrics": {deep}, "spec": {deep}}}'
    errors = assert_json_error(post_raw(api, body), 400)
    assert {"parameters", "env", "metrics", "spec"} <= set(errors), errors


# Lone surrogates: valid JSON escapes, not text. A job holding one could not be shown afterwards.

@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"name": "\ud800"}, "name"),
        ({"description": "a \udfff b"}, "description"),
        ({"parameters": [{"name": "lr", "value": "0.1\ud800"}]}, "parameters"),
        ({"parameters": [{"name": "\ud800", "value": "1"}]}, "parameters"),
        ({"env": {"MY_FLAG": "\ud83d"}}, "env"),
        ({"env": {"\ud800": "1"}}, "env"),
        ({"env": [{"name": "MY_FLAG", "value": "\ud800"}]}, "env"),
        ({"spec": "\ud800"}, "spec"),
        ({"engine": "\ud800"}, "engine"),
        ({"code_dir": "\ud800"}, "code_dir"),
        ({"boot_file": "\ud800.py"}, "boot_file"),
        ({"data_url": "obs://\ud800"}, "data_url"),
        ({"extra_args": "-x A=\ud800"}, "extra_args"),
        ({"metrics": [{"name": "loss", "regex": "loss=(\ud800)"}]}, "metrics"),
    ],
)
def test_a_lone_surrogate_is_a_field_error_at_submission(api, catalogue, overrides, field):
    # json.dumps escapes the surrogate as \\udXXX, as any client sending it would.
    response = post_raw(api, json.dumps(job_body(**overrides)))
    errors = assert_json_error(response, 400)
    assert field in errors, errors
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("field, value", [("metrics", [{"name": "loss", "regex": "loss=(\\S+)\x00"}]),
                                          ("env", {"A": "\x00"}), ("description", "a\x00b"), ("pool", "\x00")])
def test_a_nul_anywhere_in_a_json_body_is_a_field_error(api, catalogue, field, value):
    # PostgreSQL cannot store a NUL; no field of the API takes one.
    errors = assert_json_error(post_raw(api, json.dumps(job_body(**{field: value}))), 400)
    assert field in errors, errors
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("path", [JOBS + "?status=%00", JOBS + "?name=a%00b", "/?q=%00", "/?state=%00"])
def test_a_nul_in_a_query_string_is_a_400(api, client, owner, path):
    client.force_login(owner)
    answer = (api if path.startswith("/api/") else client).get(path)
    assert answer.status_code == 400
    if path.startswith("/api/"):
        assert "NUL" in assert_json_error(answer, 400)["detail"]


def test_a_surrogate_pair_is_ordinary_text(api, catalogue, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        response = post_raw(api, json.dumps(job_body(description="\U0001f680", parameters=[{"name": "x", "value": "\U0001f680"}])))
    assert response.status_code == 201, response.content
    assert TrainingJob.objects.get().parameters == [{"name": "x", "value": "\U0001f680"}]


# Parameter values: bounded, and without NUL or control characters other than tab.

@pytest.mark.parametrize(
    "parameters",
    [
        [{"name": "lr", "value": "0.1\x00"}],
        [{"name": "lr", "value": "a\nb"}],
        [{"name": "lr", "value": "a\rb"}],
        [{"name": "lr", "value": "\x1b[31mred"}],
        [{"name": "lr", "value": "\x7f"}],
        [{"name": "lr", "value": "\x9b31m"}],
        [{"name": "lr", "value": "x" * (1024 * 1024)}],
        [{"name": "lr", "value": "x" * 4097}],
        [{"name": f"p{i}", "value": "x" * 4000} for i in range(20)],
        [{"name": f"p{i}", "value": "1"} for i in range(101)],
    ],
)
def test_a_parameter_value_out_of_bounds_is_a_field_error(api, catalogue, parameters):
    errors = assert_json_error(api.post(JOBS, job_body(parameters=parameters), format="json"), 400)
    assert "parameters" in errors, errors
    assert not TrainingJob.objects.exists()


def test_a_huge_number_as_a_value_is_refused(api, catalogue):
    body = json.dumps(job_body(parameters=[{"name": "lr", "value": "NUMBER"}]))
    # 4200 digits: over the value limit; 5000: over what Python converts (the JSON is refused as a whole).
    assert "parameters" in assert_json_error(post_raw(api, body.replace('"NUMBER"', "7" * 4200)), 400)
    assert "detail" in assert_json_error(post_raw(api, body.replace('"NUMBER"', "7" * 5000)), 400)
    assert "node_count" in assert_json_error(post_raw(api, json.dumps(job_body(node_count=10**30))), 400)
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("field", ["pool", "spec", "engine"])
@pytest.mark.parametrize("typed", ["²", "٣", "1" * 20])
def test_a_number_python_reads_as_digits_but_no_row_can_have_is_a_field_error(api, catalogue, field, typed):
    errors = assert_json_error(api.post(JOBS, job_body(**{field: typed}), format="json"), 400)
    assert field in errors, errors
    assert not TrainingJob.objects.exists()


def test_a_tab_and_a_value_at_the_limit_are_accepted(api, catalogue, django_capture_on_commit_callbacks):
    parameters = [{"name": "sep", "value": "a\tb"}, {"name": "long", "value": "y" * 4096}]
    with django_capture_on_commit_callbacks(execute=False):
        response = api.post(JOBS, job_body(parameters=parameters), format="json")
    assert response.status_code == 201, response.content
    assert TrainingJob.objects.get().parameters == parameters


def test_the_page_refuses_a_control_character_in_a_hyperparameter(client, owner, catalogue):
    client.force_login(owner)
    response = client.post("/jobs/new", {"name": "j", "engine": "MPI", "code_dir": "gpu-train", "boot_file": "train.py",
                                         "spec": "cpu", "node_count": "1", "param_name": "lr", "param_value": "1\x1b[2J"})
    assert response.status_code == 200
    assert "parameters" in response.context["form"].errors
    assert not TrainingJob.objects.exists()


# Other media types on the JSON endpoint: refused with 415, never half-parsed.

@pytest.mark.parametrize("fmt", ["multipart", "form"])
def test_a_form_encoded_body_on_a_json_endpoint_is_415(api, catalogue, fmt):
    if fmt == "multipart":
        response = api.post(JOBS, {"name": "x", "engine": "MPI"}, format="multipart")
    else:
        response = post_raw(api, "name=x&engine=MPI", "application/x-www-form-urlencoded")
    assert "detail" in assert_json_error(response, 415)
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", "application/json; charset=bz2_codec"])
def test_other_media_types_are_refused_as_json(api, catalogue, content_type):
    assert_json_error(post_raw(api, "{}", content_type), (400, 415))


# Bodies over DATA_UPLOAD_MAX_MEMORY_SIZE.

def test_a_json_body_over_the_size_limit_is_a_json_413(api, catalogue, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    body = json.dumps(job_body(description="x" * 20_000))
    assert "detail" in assert_json_error(post_raw(api, body), 413)
    assert not TrainingJob.objects.exists()


def test_a_body_over_the_size_limit_at_the_real_limit_is_a_json_413(api, catalogue):
    body = json.dumps(job_body(parameters=[{"name": "big", "value": "x" * (3 * 1024 * 1024)}]))
    assert_json_error(post_raw(api, body), 413)


def test_a_multipart_field_over_the_size_limit_is_a_json_413(api, catalogue, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = api.post("/api/v1/code-dirs", {"name": "x" * 5000}, format="multipart")
    assert_json_error(response, 413)


def test_a_page_post_over_the_size_limit_is_413_not_a_crash(client, owner, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    client.force_login(owner)
    # The creation page posts its form url-encoded; its live preview posts multipart (Django's own 400).
    response = client.post("/jobs/new", "name=x&description=" + "y" * 5000, content_type="application/x-www-form-urlencoded")
    assert response.status_code == 413
    assert client.post("/jobs/preview", {"name": "x", "description": "y" * 5000}).status_code == 400


# Numbers in query strings, on every list and log endpoint.

@pytest.fixture
def job(make_job, owner):
    job = make_job(owner=owner, name="probe")
    store(job, [system_line("Preparing 2 worker(s)"), rank_line(0, "hello"), rank_line(1, "Traceback (most recent call last):")])
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.FAILED)
    return job


ENDPOINTS = ["/api/v1/specs", "/api/v1/engines", "/api/v1/code-dirs", JOBS, JOBS + "/{pk}", JOBS + "/{pk}/log",
             JOBS + "/{pk}/log/lines", JOBS + "/{pk}/log/download", JOBS + "/{pk}/log/first-error", JOBS + "/{pk}/nccl",
             JOBS + "/{pk}/outcome", JOBS + "/{pk}/metrics", JOBS + "/{pk}/outputs"]
NUMBERS = [HUGE, "-" + HUGE, str(2**63), str(2**63 - 1), str(2**64), "-1", "abc", "1e3", "", "0x10", "1.5", "\u0661"]


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("value", NUMBERS)
def test_a_number_out_of_range_in_the_query_is_never_a_500(api, job, path, value):
    for name in ("limit", "offset", "after", "before", "worker", "rank", "tail", "page", "status", "q", "system", "stream"):
        response = api.get(path.format(pk=job.pk), {name: value})
        if response.streaming:
            b"".join(response.streaming_content)
        assert response.status_code < 500, (name, value, response.status_code)
        if response.status_code >= 400:
            assert_json_error(response, response.status_code)


@pytest.mark.parametrize("value", [HUGE, str(2**63), "-1"])
def test_the_cursors_together_out_of_range_are_refused_or_empty(api, job, value):
    query = {"after": value, "limit": value, "worker": value, "rank": value}
    for path in (JOBS + "/{pk}/log/lines", JOBS + "/{pk}/log/first-error", JOBS + "/{pk}/log/download"):
        response = api.get(path.format(pk=job.pk), query)
        if response.streaming:
            b"".join(response.streaming_content)
        assert response.status_code < 500


@pytest.mark.parametrize("pk", [HUGE, str(2**63), str(2**64)])
def test_a_huge_id_is_a_json_404(api, job, pk):
    for suffix in ("", "/log", "/log/lines", "/outcome", "/nccl"):
        assert_json_error(api.get(f"{JOBS}/{pk}{suffix}"), 404)
    assert_json_error(api.post(f"{JOBS}/{pk}/stop"), 404)
    assert_json_error(api.get(f"/api/v1/code-dirs/{pk}"), 404)
    assert_json_error(api.get(f"{JOBS}/{job.pk}/evidence/{pk}"), 404)
    assert_json_error(api.get(f"{JOBS}/{pk}/evidence/1"), 404)


@pytest.mark.parametrize("pk", [HUGE, str(2**63), str(2**64)])
def test_a_huge_id_in_a_pages_address_is_a_404(client, owner, job, pk):
    client.force_login(owner)
    assert client.get(f"/jobs/{pk}/evidence/1.json").status_code == 404
    assert client.get(f"/jobs/{job.pk}/evidence/{pk}.json").status_code == 404
    assert client.post(f"/store-keys/{pk}/remove").status_code == 404
    assert client.post(f"/store-keys/{pk}").status_code == 404


@pytest.mark.parametrize("value", [HUGE, str(2**63), "-1", "abc"])
def test_the_event_stream_refuses_a_cursor_out_of_range(token, job, value):
    client = AsyncClient()

    async def read(headers=None, **kwargs):
        response = await client.get(f"{JOBS}/{job.pk}/log/events", headers={"Authorization": f"Token {token}", **(headers or {})},
                                    **kwargs)
        if response.streaming:
            return response, b"".join([chunk async for chunk in response.streaming_content])
        return response, response.content

    from asgiref.sync import async_to_sync

    for kwargs in ({"query_params": {"after": value}}, {"headers": {"Last-Event-ID": value}},
                   {"query_params": {"worker": value, "rank": value}}):
        response, _content = async_to_sync(read)(**kwargs)
        assert response.status_code < 500, kwargs
        if response.status_code >= 400:
            assert_json_error(response, response.status_code)


def test_unknown_api_routes_and_methods_answer_json(api, job):
    assert_json_error(api.get("/api/v1/no-such-thing"), 404)
    assert_json_error(api.delete(f"{JOBS}/{job.pk}"), 405)
    assert_json_error(api.post(f"{JOBS}/{job.pk}/log/events"), 405)


@pytest.mark.parametrize("path", ["/jobs/{huge}", "/jobs/{huge}/rebuild", "/?page={huge}", "/?page=-1", "/?q=%ED%A0%80",
                                  "/?page=abc"])
def test_pages_with_numbers_out_of_range_are_not_a_500(client, owner, job, path):
    client.force_login(owner)
    assert client.get(path.format(huge=HUGE)).status_code in (200, 404)


# Control characters in logs: stored as they are, neutralised where a terminal reads them.

def test_controls_are_neutralised_as_escapes_and_tab_kept():
    assert log_store.neutralise_controls("a\x1b[31mred\x1b[0m\tb\rc\x00\x7f\x9b2J") == "a\\x1b[31mred\\x1b[0m\tb\\x0dc\\x00\\x7f\\x9b2J"
    assert log_store.neutralise_controls("plain text: ünïcødé \U0001f680") == "plain text: ünïcødé \U0001f680"
    assert log_store.neutralise_controls("bad \ud800 half") == "bad \ufffd half"


def test_the_download_and_the_plain_text_log_neutralise_terminal_escapes(api, make_job, owner):
    job = make_job(owner=owner, name="escapes")
    store(job, [rank_line(0, "\x1b]0;pwned\x07\x1b[2Jcleared\tok"), LogRecord(text="bell\x07", stream=LogStream.STDERR)])
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)
    text = api.get(f"{JOBS}/{job.pk}/log").content.decode()
    download = b"".join(api.get(f"{JOBS}/{job.pk}/log/download").streaming_content).decode()
    for shown in (text, download):
        assert "\x1b" not in shown and "\x07" not in shown
        assert "[rank 0] \\x1b]0;pwned\\x07\\x1b[2Jcleared\tok\n" in shown
        assert "bell\\x07\n" in shown
    # Stored as they are: the JSON lines give the text back exactly.
    lines = api.get(f"{JOBS}/{job.pk}/log/lines").json()["lines"]
    assert lines[0]["text"] == "\x1b]0;pwned\x07\x1b[2Jcleared\tok"


# A bounded fuzz of the submission endpoint: whatever the body, never a 5xx.

SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
TEXT = st.one_of(st.text(max_size=20), st.text(st.characters(codec=None, blacklist_categories=()), max_size=10),
                 st.builds(lambda a, s, b: a + s + b, st.text(max_size=5), SURROGATES, st.text(max_size=5)),
                 st.sampled_from(["", " ", "\x00", "\x1b[2J", "a\nb", "x" * 5000, "../etc/passwd", "MPI", "cpu",
                                  "gpu-train", "train.py", "0", "-1", HUGE]))
NUMBER = st.one_of(st.integers(), st.integers(min_value=-(10**40), max_value=10**40), st.sampled_from([10**30, 2**63, -(2**63) - 1]),
                   st.floats(allow_nan=False, allow_infinity=False))
SCALAR = st.one_of(st.none(), st.booleans(), NUMBER, TEXT)
ANY_JSON = st.recursive(SCALAR, lambda children: st.one_of(st.lists(children, max_size=4),
                                                             st.dictionaries(TEXT, children, max_size=4)), max_leaves=12)
PARAMETER = st.one_of(st.fixed_dictionaries({"name": TEXT, "value": st.one_of(TEXT, NUMBER, ANY_JSON)}), ANY_JSON)
FIELDS = {
    "name": st.one_of(st.just("fuzz-job"), TEXT, ANY_JSON),
    "description": st.one_of(TEXT, ANY_JSON),
    "engine": st.one_of(st.sampled_from(["MPI", "local", "1", 1]), TEXT, NUMBER, ANY_JSON),
    "code_dir": st.one_of(st.just("gpu-train"), TEXT, NUMBER, ANY_JSON),
    "boot_file": st.one_of(st.just("train.py"), TEXT, ANY_JSON),
    "data_url": st.one_of(TEXT, ANY_JSON),
    "train_url": st.one_of(TEXT, ANY_JSON),
    "parameters": st.one_of(st.lists(PARAMETER, max_size=4), ANY_JSON),
    "env": st.one_of(st.dictionaries(TEXT, st.one_of(TEXT, NUMBER, ANY_JSON), max_size=4),
                     st.lists(st.fixed_dictionaries({"name": TEXT, "value": TEXT}), max_size=3), ANY_JSON),
    "spec": st.one_of(st.just("cpu"), TEXT, NUMBER, ANY_JSON),
    "pool": st.one_of(TEXT, NUMBER, ANY_JSON),
    "node_count": st.one_of(st.integers(1, 4), NUMBER, TEXT, ANY_JSON),
    "extra_args": st.one_of(TEXT, ANY_JSON),
    "auto_stop_hours": st.one_of(NUMBER, TEXT, ANY_JSON),
    "auto_stop": st.one_of(st.sampled_from(["", "1", "custom"]), TEXT, ANY_JSON),
    "auto_stop_custom": st.one_of(NUMBER, TEXT),
    "metrics": st.one_of(st.lists(st.fixed_dictionaries({"name": TEXT, "regex": TEXT}), max_size=3), ANY_JSON),
    "watchdog_seconds": st.one_of(NUMBER, TEXT, ANY_JSON),
}
VALID_BODY = {"name": "fuzz-job", "engine": "MPI", "code_dir": "gpu-train", "boot_file": "train.py", "spec": "cpu",
              "node_count": 2}


@st.composite
def mutated_valid_body(draw):
    """A valid submission with a few fields replaced, added or left out: most reach the form and some pass."""
    body = dict(VALID_BODY)
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=3, unique=True)):
        if draw(st.integers(0, 5)) == 0:
            body.pop(name, None)
        else:
            body[name] = draw(FIELDS[name])
    return body


BODY = st.one_of(
    mutated_valid_body(),
    mutated_valid_body(),
    st.fixed_dictionaries({}, optional=FIELDS),
    st.dictionaries(TEXT, ANY_JSON, max_size=5),
    ANY_JSON,
)


@hypothesis_settings(max_examples=200, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(body=BODY)
def test_fuzzed_submissions_never_answer_5xx(api, catalogue, django_capture_on_commit_callbacks, body):
    with django_capture_on_commit_callbacks(execute=False):
        response = post_raw(api, json.dumps(body))
    event(f"status {response.status_code}")
    assert response.status_code < 500, (body, response.content[:300])
    if response.status_code >= 400:
        assert_json_error(response, response.status_code)
    else:
        assert response.status_code == 201
        # What was accepted can be shown: the job's API answer and its page.
        job = TrainingJob.objects.get(pk=response.json()["id"])
        assert api.get(f"{JOBS}/{job.pk}").status_code == 200
        page = Client()
        page.force_login(job.owner)
        assert page.get(f"/jobs/{job.pk}").status_code == 200
        job.delete()
