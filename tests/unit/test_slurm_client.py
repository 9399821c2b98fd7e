"""The Slurm client's pure parts and its reading of slurmrestd's answers, with the HTTP boundary faked (the
real server is in tests/integration/test_local_slurm.py)."""

import base64
import json
import time

import pytest
import requests
from requests.adapters import BaseAdapter

from jobs.launch.plan import JobValues, SpecValues
from jobs.slurm.batch import PoolValues, batch_request
from jobs.slurm.rest import (
    Credentials,
    SlurmAuthRefused,
    SlurmError,
    SlurmRest,
    SlurmUnreachable,
    UnsupportedVersion,
    offered_versions,
    token_expiry,
)
from jobs.slurm.states import Phase, exit_status, phase_of, reason_words


def jwt(expires_at: int) -> str:
    def part(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part({'exp': expires_at, 'sun': 'ma-user'})}.signature"


class FakeSlurmrestd(BaseAdapter):
    """Answers each (method, path) with a status and a JSON body, and keeps what was asked."""

    def __init__(self, answers: dict[tuple[str, str], tuple[int, object]]):
        super().__init__()
        self.answers = answers
        self.requests: list[requests.PreparedRequest] = []

    def send(self, request, **kwargs):
        self.requests.append(request)
        path = request.path_url
        status, body = self.answers.get((request.method, path), (404, {"errors": [{"error": "no such path"}]}))
        response = requests.Response()
        response.status_code = status
        response._content = body if isinstance(body, bytes) else json.dumps(body).encode()
        response.request = request
        response.url = request.url
        return response

    def close(self):
        pass


def client(answers, token: str | None = None) -> tuple[SlurmRest, FakeSlurmrestd]:
    fake = FakeSlurmrestd(answers)
    session = requests.Session()
    session.mount("http://", fake)
    rest = SlurmRest("http://slurm.example:6820/", Credentials("ma-user", token or jwt(int(time.time()) + 600)),
                     session=session)
    return rest, fake


PING = {"meta": {"Slurm": {"release": "22.05.8"}}, "errors": [], "pings": [{"ping": "UP"}]}


def test_a_server_offering_v0_0_38_is_accepted_and_every_request_carries_the_user_and_its_token():
    rest, fake = client({("GET", "/openapi/v3"): (200, {"paths": {"/slurm/v0.0.37/ping": {}, "/slurm/v0.0.38/ping": {}}}),
                         ("GET", "/slurm/v0.0.38/ping"): (200, PING)})
    assert rest.check_version() == "22.05.8"
    assert {request.headers["X-SLURM-USER-NAME"] for request in fake.requests} == {"ma-user"}
    assert all(request.headers["X-SLURM-USER-TOKEN"] == rest.credentials.token for request in fake.requests)


def test_a_server_of_another_release_is_refused_in_one_sentence_naming_what_it_offers():
    rest, _ = client({("GET", "/openapi/v3"): (200, {"paths": {"/slurm/v0.0.40/ping": {}, "/slurm/v0.0.39/jobs": {},
                                                                "/slurmdb/v0.0.40/jobs": {}}})})
    with pytest.raises(UnsupportedVersion) as refused:
        rest.check_version()
    assert refused.value.offered == ["v0.0.39", "v0.0.40"]
    assert str(refused.value) == ("this Slurm's REST server offers v0.0.39, v0.0.40; the console speaks v0.0.38 "
                                  "(Slurm 22.05): point the pool at a slurmrestd that serves openapi/v0.0.38")


def test_versions_are_ordered_as_numbers_not_as_text():
    assert offered_versions(["/slurm/v0.0.9/ping", "/slurm/v0.0.38/ping", "/openapi"]) == ["v0.0.9", "v0.0.38"]


def test_an_expired_token_is_refused_before_asking_with_the_time_it_expired():
    rest, fake = client({}, token=jwt(1_700_000_000))
    with pytest.raises(SlurmAuthRefused, match="expired at 2023-11-14 22:13 UTC"):
        rest.job(1)
    assert fake.requests == []


def test_a_token_that_is_no_jwt_has_no_expiry_to_read():
    assert token_expiry("not-a-jwt") is None
    assert token_expiry("a.%%%.c") is None
    assert token_expiry(jwt(1234)) == 1234


def test_slurmctld_away_or_refusing_the_signature_is_said_unreachable_not_an_unspecified_error():
    answer = {"errors": [{"description": "slurmctld config is unable to load", "error": "Unspecified error",
                          "source": "slurm_load_ctl_conf"}]}
    rest, _ = client({("GET", "/slurm/v0.0.38/job/7"): (500, answer)})
    with pytest.raises(SlurmUnreachable, match="slurmctld did not: it is down, or it refused the token"):
        rest.job(7)


def test_no_answer_at_all_is_unreachable():
    session = requests.Session()
    rest = SlurmRest("http://127.0.0.1:9", Credentials("ma-user", "t"), timeout=2, session=session)
    with pytest.raises(SlurmUnreachable, match="did not answer"):
        rest.nodes()


def test_a_401_is_a_refused_token():
    rest, _ = client({("GET", "/slurm/v0.0.38/nodes"): (401, b"Authentication failure")})
    with pytest.raises(SlurmAuthRefused, match="HTTP 401"):
        rest.nodes()


def test_a_job_slurm_no_longer_knows_is_none_and_its_cancel_is_no_error():
    gone = {"errors": [{"error": "Invalid job id specified", "error_number": 2017}]}
    rest, _ = client({("GET", "/slurm/v0.0.38/job/9"): (500, gone), ("DELETE", "/slurm/v0.0.38/job/9"): (500, gone)})
    assert rest.job(9) is None
    rest.cancel(9)


def test_slurms_own_refusal_of_a_submission_is_passed_on_in_its_words():
    refused = {"errors": [{"error": "Invalid account or account/partition combination specified"}]}
    rest, _ = client({("POST", "/slurm/v0.0.38/job/submit"): (500, refused)})
    with pytest.raises(SlurmError, match="Invalid account"):
        rest.submit({"job": {"name": "tc-1"}, "script": "#!/bin/sh\n"})


def test_a_submission_answers_the_new_job_id():
    rest, fake = client({("POST", "/slurm/v0.0.38/job/submit"): (200, {"errors": [], "job_id": 42})})
    assert rest.submit({"job": {"name": "tc-1"}, "script": "#!/bin/sh\n"}) == 42
    assert json.loads(fake.requests[0].body) == {"job": {"name": "tc-1"}, "script": "#!/bin/sh\n"}


@pytest.mark.parametrize(("state", "phase"), [
    ("PENDING", Phase.WAITING), ("REQUEUED", Phase.WAITING), ("CONFIGURING", Phase.WAITING),
    ("RUNNING", Phase.RUNNING), ("COMPLETING", Phase.RUNNING), ("SUSPENDED", Phase.RUNNING),
    ("COMPLETED", Phase.COMPLETED), ("FAILED", Phase.FAILED), ("OUT_OF_MEMORY", Phase.FAILED),
    ("BOOT_FAIL", Phase.FAILED), ("TIMEOUT", Phase.TIME_LIMIT), ("NODE_FAIL", Phase.NODE_LOST),
    ("PREEMPTED", Phase.PREEMPTED), ("CANCELLED", Phase.CANCELLED), ("cancelled by 1000", Phase.CANCELLED),
    ("SOME_LATER_STATE", Phase.RUNNING),
])
def test_each_slurm_state_has_its_phase(state, phase):
    assert phase_of(state) is phase


@pytest.mark.parametrize(("reason", "description", "words"), [
    ("Priority", None, "waiting for higher-priority jobs (Priority)"),
    ("Resources", None, "waiting for nodes to become free (Resources)"),
    ("AssocGrpCpuLimit", None, "your account's quota is in use: Cpu (AssocGrpCpuLimit)"),
    ("QOSMaxJobsPerUserLimit", None, "the QOS's quota is in use: JobsPerUser (QOSMaxJobsPerUserLimit)"),
    ("None", None, "waiting for Slurm to schedule it"),
    ("", None, "waiting for Slurm to schedule it"),
    ("FrontEndDown", "no front end node is available", "no front end node is available (FrontEndDown)"),
    ("FrontEndDown", None, "waiting: FrontEndDown"),
])
def test_why_a_job_waits_is_said_in_words_with_slurms_code_beside_them(reason, description, words):
    assert reason_words(reason, description) == words


def test_an_exit_code_is_read_from_the_wait_status_slurm_gives():
    assert exit_status(768) == exit_status(3 << 8)
    assert (exit_status(768).code, exit_status(768).signal) == (3, None)
    assert (exit_status(9).code, exit_status(9).signal) == (None, 9)
    assert (exit_status(0).code, exit_status(None).code) == (0, None)


def job_values(gpus: int = 0) -> JobValues:
    return JobValues(job_id=12, dns_name="job-12", spec=SpecValues(cpu_cores=8, memory_gb=32, gpu_count=gpus,
                                                                   processes_per_node=max(gpus, 1)),
                     node_count=2, image="localhost/mpi:1", python="python3", code_dir_name="code",
                     code_dir_path="/code", boot_file="train.py")


def test_a_batch_job_asks_each_node_for_the_specs_share_and_is_requeued_rather_than_lost():
    request = batch_request(job_values(), PoolValues("gpu"), "#!/bin/bash\n", name="tc-12", account="vision", qos="high",
                            time_limit_minutes=90)
    job = request["job"]
    assert (job["name"], job["partition"], job["nodes"], job["tasks_per_node"]) == ("tc-12", "gpu", 2, 1)
    assert (job["cpus_per_task"], job["memory_per_node"], job["requeue"]) == (8, 32 * 1024, True)
    assert (job["account"], job["qos"], job["time_limit"]) == ("vision", "high", 90)
    assert "gres" not in job and "exclusive" not in job


def test_a_time_limit_is_near_once_less_than_the_notice_is_left_and_no_limit_is_never_near():
    from jobs.slurm.states import time_limit_ends_at, time_limit_near

    assert time_limit_ends_at(1_000_000, 60) == 1_003_600
    assert time_limit_ends_at(1_000_000, 0xFFFFFFFF) is None and time_limit_ends_at(1_000_000, 0xFFFFFFFE) is None
    assert time_limit_ends_at(0, 60) is None and time_limit_ends_at(None, None) is None
    assert time_limit_near(1_003_600, 150, now=1_003_450)
    assert time_limit_near(1_003_600, 150, now=1_004_000), "a limit already past is near"
    assert not time_limit_near(1_003_600, 150, now=1_003_449)
    assert not time_limit_near(None, 150, now=1_003_600)


def test_gpus_become_gres_per_node_and_whole_nodes_are_left_to_the_partition():
    job = batch_request(job_values(gpus=8), PoolValues("gpu"), "#!/bin/bash\n", name="tc-12")["job"]
    # slurmrestd 22.05 refuses the field's "true": a site gives whole nodes with OverSubscribe=EXCLUSIVE.
    assert job["gres"] == "gpu:8" and "exclusive" not in job
    assert "account" not in job and "qos" not in job and "time_limit" not in job
