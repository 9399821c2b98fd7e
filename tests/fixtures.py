"""The unit tests' people and jobs, defined once (tests/unit/conftest.py makes them fixtures there).

The people, as the console tells them apart (jobs.submission.access: owners see their own jobs, staff everyone's):

- owner: the ordinary user whose job a test is about; `make_job()` gives a job of the owner's.
- teammate: another ordinary user working beside the owner; not the job's owner, so sees only their own.
- stranger: an ordinary user with nothing to do with the owner's jobs.
- staff: is_staff and no model permissions: sees everyone's jobs, may change nothing in the back office.

Each is made on first use and found after, so a test may take the `owner` fixture and also let
`make_job()` pick the owner, in either order.

The integration and browser tests keep their own fixtures (a real cluster, a real Celery worker).
"""

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from jobs.models import CodeDirectory, Engine, EngineVersion, ResourceSpec, TrainingJob


def password_of(username: str) -> str:
    return f"{username}-password"


def person(username: str, **fields):
    """The user of that name, made with a password (hashed with MD5 in the tests, see tests/conftest.py)."""
    users = get_user_model().objects
    return users.filter(username=username).first() or users.create_user(username, password=password_of(username), **fields)


@pytest.fixture
def owner(db):
    return person("owner")


@pytest.fixture
def teammate(db):
    return person("teammate")


@pytest.fixture
def stranger(db):
    return person("stranger")


@pytest.fixture
def staff(db):
    user = person("staff", is_staff=True)
    assert not user.get_all_permissions()
    return user


def api_client(user) -> APIClient:
    """An API client signed in as the user."""
    client = APIClient()
    client.force_authenticate(user)
    return client


def cpu_spec(network: str = "socket") -> ResourceSpec:
    """A small CPU flavor (2 cores, 2 processes per node) on the given network."""
    spec, _ = ResourceSpec.objects.get_or_create(
        name=f"cpu-{network}", defaults={"cpu_cores": 2, "memory_gb": 4, "cpu_slots_per_node": 2, "network": network})
    return spec


def new_job(*, owner=None, name: str = "job", node_count: int = 2, network: str = "socket", **traits) -> TrainingJob:
    """A Pending job of the owner's on 2 nodes of a small CPU flavor; any field of the job may be given as a trait.

    `network` picks the flavor's network when no `spec` is given. The engine (MPI v1) and the code
    directory are shared by every job of a test.
    """
    traits.setdefault("spec", None)
    if traits["spec"] is None:
        traits["spec"] = cpu_spec(network)
    if "engine_version" not in traits:
        traits["engine_version"], _ = EngineVersion.objects.get_or_create(
            engine=Engine.objects.get_or_create(name="MPI")[0], version="v1")
    if "code_dir" not in traits:
        traits["code_dir"], _ = CodeDirectory.objects.get_or_create(name="code", defaults={"path": "/nonexistent"})
    fields = {"boot_file": "train.py", "bind_args": "", "x_args": "", "mca_args": "", "tune_prefixes": "MA_", **traits}
    return TrainingJob.objects.create(name=name, owner=owner or person("owner"), node_count=node_count, **fields)


@pytest.fixture
def make_job(db):
    """The job factory: make_job(**traits), e.g. make_job(status=JobStatus.FAILED, node_count=1)."""
    return new_job


def add_nodes(spec: ResourceSpec, count: int, prefix: str = "node") -> list:
    """Nodes of a spec, so jobs asking for up to `count` of them can be submitted (more are refused)."""
    from jobs.models import Node

    return [Node.objects.create(name=f"{prefix}-{spec.name}-{index}", address=f"10.9.0.{index + 1}", spec=spec)
            for index in range(count)]


@pytest.fixture
def token(owner) -> str:
    """An API token of the owner's."""
    from jobs.models import ApiToken

    return ApiToken.issue(owner, "test")[1]


@pytest.fixture
def api(token) -> APIClient:
    """An API client that sends the owner's token, as a script would."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.fixture
def catalogue(settings, tmp_path):
    """What a submission names: the shipped examples, an MPI engine version, a CPU spec with 4 nodes."""
    from jobs.code_dirs.service import register_examples

    settings.CODE_DIRS_ROOT = tmp_path / "code-dirs"
    register_examples()
    EngineVersion.objects.create(engine=Engine.objects.create(name="MPI"), version="local", python="/usr/bin/python3")
    add_nodes(ResourceSpec.objects.create(name="cpu", cpu_cores=2, memory_gb=4, cpu_slots_per_node=2, max_nodes=4), 4)


def job_body(**overrides) -> dict:
    """A submission of the example to the API, with these fields changed."""
    body = {"name": "train-1", "engine": "MPI", "code_dir": "gpu-train", "boot_file": "train.py", "spec": "cpu",
            "node_count": 2, "parameters": [{"name": "lr", "value": "0.1"}], "env": {"MY_FLAG": "x y"}}
    body.update(overrides)
    return body
