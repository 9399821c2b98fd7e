"""A job cannot make a user namespace (and with it a full set of capabilities, and mounts) inside its
container: the console's seccomp profile refuses new namespaces, while threads, fork, a subprocess and MPI
still work."""

import pytest

from jobs.models import JobStatus
from tests.integration.helpers import reports, submit_program, wait_for
from tests.security.containment import RANKS


@pytest.mark.attack("unshare -Urm (a user namespace, then a tmpfs mount) in every rank's container",
                    "it is refused (EPERM); threads, fork, a subprocess and the MPI job still work")
def test_no_rank_can_make_a_user_namespace_and_the_mpi_job_still_completes(api, console):
    job = submit_program(api, "attack_userns.py")

    job = wait_for(job, [JobStatus.COMPLETED], timeout=180)
    found = reports(job, "USERNS")
    assert [report["rank"] for report in found] == list(range(RANKS))
    for report in found:
        command = report["unshare_command"]
        assert command["rc"] not in (0, None) and "mounted" not in command["said"], report
        assert "Operation not permitted" in command["said"], report
        assert report["unshare_call"] == "EPERM", report
        assert (report["threads"], report["fork"], report["subprocess"]) == (True, True, "42"), report
        assert report["allreduce"] == sum(range(1, RANKS + 1)), report
