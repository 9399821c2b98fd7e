"""What a user gives mpirun stays theirs, on the real 2-node local cluster.

Open MPI passes the MCA parameters it is given (on its command line, or as OMPI_MCA_* variables) on
to every remote orted on that orted's ssh command line, quoted only with double quotes, so the node's
shell reads them. Before the allow-list, `OMPI_MCA_x="$(touch F)"` as a variable and
`--mca x "$(touch F)"` in OPENMPI_EXTRA_ARGS both ran `touch` on worker-1 (as ma-user). Now they are
refused at submission, with the field's error; an allowed option and an `-x NAME=value` with spaces
and shell words still run, the value verbatim on every rank and nothing of it executed.
"""

import json
import shlex
import uuid
from pathlib import Path

import pytest

from jobs.models import CodeDirectory, JobStatus, TrainingJob
from tests.integration.helpers import (
    CLUSTER_NODES,
    CLUSTER_SLOTS,
    code_dir_from_program,
    log_text,
    rank_lines,
    wait_for,
)

CODE_DIR = "probe-integrity"


@pytest.fixture
def probe_dir(console, owner):
    code_dir = code_dir_from_program(CODE_DIR, "probe.py")
    # The submitting user's own, so whatever the sharing rules are, they may run it.
    CodeDirectory.objects.filter(pk=code_dir.pk).update(owner=owner)
    return code_dir


@pytest.fixture
def marker():
    """A path a command run by a shell on a node would create: the nodes share this machine's /tmp."""
    path = Path(f"/tmp/tc-integrity-{uuid.uuid4().hex}")
    yield path
    path.unlink(missing_ok=True)


def post(api, **fields):
    body = {"name": "integrity", "engine": "local-mpi4py", "spec": "local-cpu", "node_count": CLUSTER_NODES,
            "code_dir": CODE_DIR, "boot_file": "probe.py", **fields}
    return api.post("/api/v1/training-jobs", body, format="json")


def test_an_mca_variable_carrying_a_command_is_refused_at_submission(api, probe_dir, marker):
    response = post(api, env={"OMPI_MCA_orte_base_help_aggregate": f"$(touch {marker})", "MY_FLAG": "1"})

    assert response.status_code == 400, response.content
    errors = response.json()
    assert list(errors) == ["env"]
    assert errors["env"][0].startswith("OMPI_MCA_orte_base_help_aggregate: ")
    assert not TrainingJob.objects.exists()
    assert not marker.exists()


def test_every_reserved_variable_is_named_in_one_answer(api, probe_dir):
    response = post(api, env={"LD_PRELOAD": "/tmp/x.so", "OK": "1", "HOME": "/tmp", "PATH": "/tmp/bin"})

    assert response.status_code == 400, response.content
    assert [message.split(":")[0] for message in response.json()["env"]] == ["LD_PRELOAD", "HOME", "PATH"]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ('--mca x "$(touch {marker})"', "x"),
        ('--mca btl_tcp_if_include "lo $(touch {marker})"', "btl_tcp_if_include"),
        ("--mca orte_rsh_agent 'sh -c \"touch {marker}\"'", "orte_rsh_agent"),
        ("--report-bindings -x OMPI_MCA_plm_rsh_agent=/bin/false", "OMPI_MCA_plm_rsh_agent"),
        ("--prefix /tmp", "--prefix"),
        ("/bin/sh -c 'touch {marker}'", "/bin/sh"),
    ],
)
def test_extra_args_that_escape_are_refused_at_submission_naming_the_option(api, probe_dir, marker, extra, named):
    response = post(api, extra_args=extra.format(marker=marker))

    assert response.status_code == 400, response.content
    errors = response.json()
    assert list(errors) == ["extra_args"]
    assert named in errors["extra_args"][0]
    assert not TrainingJob.objects.exists()
    assert not marker.exists()


def test_an_allowed_option_and_an_x_value_with_spaces_run_and_reach_every_rank_verbatim(api, probe_dir, marker, console):
    value = f"a b  'c' \"d\" $(touch {marker}) ; `id` ção"
    subnet = console["nodes"][0].address.rsplit(".", 1)[0] + ".0/24"
    extra = f"--report-bindings --mca btl_tcp_if_include {subnet} -x " + shlex.quote(f"PROBE_SPACED={value}")

    response = post(api, extra_args=extra, parameters=[{"name": "show_env", "value": "PROBE_SPACED"}])
    assert response.status_code == 201, response.content
    job = wait_for(TrainingJob.objects.get(pk=response.json()["id"]), [JobStatus.COMPLETED], timeout=180)

    assert job.extra_args == extra
    assert f"--mca btl_tcp_if_include {subnet} -x " in job.command
    reports = [json.loads(line.text.removeprefix("PROBE ")) for line in rank_lines(job) if line.text.startswith("PROBE ")]
    assert len(reports) == CLUSTER_NODES * CLUSTER_SLOTS
    assert {report["host"] for report in reports} == {f"{job.dns_name}-worker-{index}" for index in range(CLUSTER_NODES)}
    assert all(report["env"]["PROBE_SPACED"] == value for report in reports), reports
    assert all(report["allreduce"] == sum(range(1, CLUSTER_NODES * CLUSTER_SLOTS + 1)) for report in reports)
    # --report-bindings took effect (mpirun's own lines), and nothing in the value ran anywhere.
    assert "MCW rank" in log_text(job)
    assert not marker.exists()
