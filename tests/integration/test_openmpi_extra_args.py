"""A job whose OPENMPI_EXTRA_ARGS names an interface its nodes do not have (nodes never checked, so the form
cannot know): Open MPI only warns, the ranks crash, and the failure card quotes Open MPI and names the setting."""

from jobs.models import JobStatus
from tests.integration.helpers import submit_program, wait_for


def test_an_unknown_tcp_interface_fails_the_job_with_a_card_quoting_open_mpi_and_naming_openmpi_extra_args(api, console):
    job = submit_program(api, "numbered.py", parameters=[{"name": "count", "value": "5"}],
                         extra_args="--mca btl_tcp_if_include bogus0")
    job = wait_for(job, [JobStatus.FAILED], timeout=240)

    card = job.failure
    assert card["kind"] == "openmpi_options", card
    assert "Message:    Unknown interface name" in card["openmpi"][0]
    assert "--mca btl_tcp_if_include bogus0, given in OPENMPI_EXTRA_ARGS" in card["hints"][0]
    assert "library conflict" not in str(card)
