"""An interface OPENMPI_EXTRA_ARGS names must exist on the nodes the job may run on (their health checks say which
they have), and when Open MPI warns of a setting all the same, the failure card quotes Open MPI and names
OPENMPI_EXTRA_ARGS, not a library conflict."""

import pytest

from jobs.logs.store import LogRecord
from jobs.models import JobStatus, LogStream, Node, ResourcePool, ResourceSpec, TrainingJob
from jobs.pages.card_words import card_words
from jobs.results.failure_card import FailureFacts, explain_failure
from jobs.results.mpirun_report import openmpi_messages
from jobs.results.rank_records import RankRecord
from jobs.results.recording import record_failure
from tests.fixtures import job_body
from tests.unit.log_helpers import quiet_redis, rank_line, store  # noqa: F401

# mpirun's first lines in a job of `--mca btl_tcp_if_include bogus0` on the local cluster (Open MPI 4.1); the ranks
# then died of SIGSEGV in MPI_Barrier.
UNKNOWN_INTERFACE = """--------------------------------------------------------------------------
WARNING: An invalid value was given for btl_tcp_if_include.  This
value will be ignored.

  Local host: numbered-1-worker-1
  Value:      bogus0
  Message:    Unknown interface name
--------------------------------------------------------------------------
[numbered-1-worker-0:00046] [[2997,0],0] ORTE_ERROR_LOG: Out of resource in file ../../../orte/util/show_help.c at line 501
""".splitlines()

# ... and for `--mca oob_tcp_if_include bogus0`: an error, not a warning, and mpirun ends before any rank.
NO_OOB_NETWORK = """--------------------------------------------------------------------------
None of the TCP networks specified to be included for out-of-band communications
could be found:

  Value given: bogus0

Please revise the specification and try again.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
No network interfaces were found for out-of-band communications. We require
at least one available network for out-of-band messaging.
--------------------------------------------------------------------------""".splitlines()

SEGFAULTED = {rank: RankRecord(rank, 5.0 + rank, 139) for rank in range(4)}


def facts(**fields) -> FailureFacts:
    defaults = {"outcome": "exit", "exit_code": 139, "rank_workers": (0, 0, 1, 1), "nodes": {0: "node-a", 1: "node-b"},
                "records": SEGFAULTED}
    return FailureFacts(**{**defaults, **fields})


def everything_said(card) -> str:
    return "\n".join([card["title"], card["how"], *card["hints"], *(group["what"] for group in card["others"])])


# At submission: the interfaces the nodes reported.

@pytest.fixture
def nodes_with_facts(catalogue):
    nodes = list(Node.objects.filter(spec__name="cpu"))
    for node in nodes:
        node.health = {"interfaces": ["eth0", "ib0", "lo"] if node.name.endswith("-0") else ["eth0", "lo"]}
        node.save()
    return nodes


@pytest.fixture
def submit(api, django_capture_on_commit_callbacks):
    def post(**fields):
        with django_capture_on_commit_callbacks(execute=False):
            return api.post("/api/v1/training-jobs", job_body(**fields), format="json")
    return post


def test_an_owner_naming_an_interface_the_nodes_do_not_have_is_told_which_and_what_they_have(submit, nodes_with_facts):
    response = submit(extra_args="--mca btl_tcp_if_include bogus0")

    assert response.status_code == 400
    assert response.json() == {"extra_args": [
        "btl_tcp_if_include: bogus0 is not a network interface of every node this job may run on "
        "(interfaces they all have: eth0, lo)."]}
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("extra_args", ["-mca oob_tcp_if_include lo,bogus1", "--mca btl_tcp_if_include bogus1",
                                        "--report-bindings -mca oob_tcp_if_include eth0,bogus1"])
def test_every_spelling_and_list_of_the_interface_parameters_is_checked(submit, nodes_with_facts, extra_args):
    response = submit(extra_args=extra_args)

    assert response.status_code == 400
    assert "bogus1 is not a network interface" in response.json()["extra_args"][0]


def test_an_interface_only_some_of_the_nodes_have_is_refused(submit, nodes_with_facts):
    response = submit(extra_args="--mca btl_tcp_if_include ib0")

    assert response.status_code == 400
    assert "ib0 is not a network interface of every node" in response.json()["extra_args"][0]


@pytest.mark.parametrize("extra_args", [
    "--mca btl_tcp_if_include eth0,10.9.0.0/24 -mca oob_tcp_if_exclude lo",
    # An exclude list may name interfaces the nodes lack, as Open MPI's own defaults do.
    "--mca btl_tcp_if_exclude lo,docker0 -mca oob_tcp_if_exclude docker0",
])
def test_interfaces_every_node_has_networks_in_cidr_notation_and_any_exclude_list_are_accepted(
        submit, nodes_with_facts, extra_args):
    response = submit(extra_args=extra_args)

    assert response.status_code == 201, response.content


def test_nodes_that_reported_no_interfaces_as_a_slurm_pools_may_not_refuse_any(submit, catalogue):
    assert not any(Node.objects.values_list("health", flat=True))

    response = submit(extra_args="--mca btl_tcp_if_include bogus0")

    assert response.status_code == 201, response.content


def test_only_the_nodes_of_the_chosen_pool_count(submit, nodes_with_facts):
    pool = ResourcePool.objects.create(name="team")
    spec = ResourceSpec.objects.get(name="cpu")
    Node.objects.create(name="pooled-0", address="10.9.1.1", spec=spec, pool=pool, health={"interfaces": ["ib0", "lo"]})
    Node.objects.create(name="pooled-1", address="10.9.1.2", spec=spec, pool=pool, health={"interfaces": ["ib0", "lo"]})

    accepted = submit(pool="team", extra_args="--mca btl_tcp_if_include ib0")
    refused = submit(pool="team", extra_args="--mca btl_tcp_if_include eth0")

    assert accepted.status_code == 201, accepted.content
    assert refused.json()["extra_args"][0].endswith("(interfaces they all have: ib0, lo).")


def test_the_creation_page_refuses_the_unknown_interface_on_the_field_it_was_typed_in(client, owner, nodes_with_facts):
    from jobs.models import CodeDirectory, EngineVersion

    client.force_login(owner)
    page = client.post("/jobs/new", {
        "name": "job-1", "engine": EngineVersion.objects.get().pk, "code_dir": CodeDirectory.objects.get(name="gpu-train").pk,
        "boot_file": "train.py", "spec": ResourceSpec.objects.get(name="cpu").pk, "node_count": "2",
        "extra_args": "--mca btl_tcp_if_include bogus0"})

    assert page.status_code == 200
    assert page.context["form"].errors["extra_args"][0].startswith("btl_tcp_if_include: bogus0 is not")


# The failure card: Open MPI's own words.

def test_a_log_with_open_mpis_unknown_interface_warning_gives_a_card_quoting_it_and_naming_openmpi_extra_args():
    card = explain_failure(facts(mpirun_opening=UNKNOWN_INTERFACE, extra_args="--mca btl_tcp_if_include bogus0"))

    assert card["kind"] == "openmpi_options"
    assert card["title"] == "Rank 0 (worker-0, node-a) failed after Open MPI warned about OPENMPI_EXTRA_ARGS"
    assert "Message:    Unknown interface name" in card["openmpi"][0]
    assert card["openmpi"][0].startswith("WARNING: An invalid value was given for btl_tcp_if_include.")
    assert card["hints"] == ["Open MPI's words above are about --mca btl_tcp_if_include bogus0, given in "
                             "OPENMPI_EXTRA_ARGS: the likely cause. Correct it or leave it out, then rebuild the job."]
    assert card["how"] == "exit code 139: a segmentation fault"
    assert "library conflict" not in everything_said(card)


def test_the_card_naming_openmpi_extra_args_reads_in_portuguese():
    from django.utils import translation

    card = explain_failure(facts(mpirun_opening=UNKNOWN_INTERFACE, extra_args="-mca btl_tcp_if_include bogus0"))

    with translation.override("pt-br"):
        assert card_words(card["how"]) == "código de saída 139: uma falha de segmentação"
        assert "OPENMPI_EXTRA_ARGS" in card_words(card["title"]) and card_words(card["title"]).startswith("Rank 0")


def test_an_oob_network_open_mpi_could_not_find_ends_mpirun_with_a_card_naming_openmpi_extra_args():
    card = explain_failure(facts(exit_code=1, records={}, mpirun_opening=NO_OOB_NETWORK,
                                 extra_args="--mca oob_tcp_if_include bogus0"))

    assert (card["kind"], card["rank"]) == ("openmpi_options", None)
    assert card["title"] == "mpirun failed after Open MPI warned about OPENMPI_EXTRA_ARGS"
    assert "Value given: bogus0" in card["openmpi"][0]
    assert "--mca oob_tcp_if_include bogus0" in card["hints"][0]


def test_open_mpis_warnings_are_quoted_even_for_a_job_without_extra_args_and_the_usual_hint_stays():
    card = explain_failure(facts(mpirun_opening=UNKNOWN_INTERFACE))

    assert card["kind"] == "segfault"
    assert "Unknown interface name" in card["openmpi"][0]
    assert card["hints"][-1] == "Open MPI warned before the failure (its words are quoted above): they may explain it."
    assert not any("OPENMPI_EXTRA_ARGS" in hint for hint in card["hints"])


def test_a_rank_that_raised_an_exception_of_its_own_is_not_blamed_on_the_setting_open_mpi_warned_of():
    tail = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>', "KeyError: 'labels'"]
    card = explain_failure(facts(exit_code=1, records={1: RankRecord(1, 1.0, 1)}, rank_tail=tail,
                                 mpirun_opening=UNKNOWN_INTERFACE, extra_args="--mca btl_tcp_if_include bogus0"))

    assert card["kind"] == "exception"
    assert card["openmpi"], "the warning is quoted all the same"


def test_a_warning_about_something_the_job_did_not_set_names_no_setting_of_it():
    card = explain_failure(facts(mpirun_opening=UNKNOWN_INTERFACE, extra_args="--report-bindings --mca mpi_leave_pinned 1"))

    assert card["kind"] == "segfault"
    assert not any("OPENMPI_EXTRA_ARGS" in hint for hint in card["hints"])


def test_only_framed_messages_are_taken_and_each_once():
    lines = ["[host:1] a line of mpirun's own", *UNKNOWN_INTERFACE, *UNKNOWN_INTERFACE[:8], "-" * 74, "Not a warning.", "-" * 74]

    assert len(openmpi_messages(lines)) == 1
    assert openmpi_messages(lines, ("Not",)) == [openmpi_messages(lines)[0], "Not a warning."]


@pytest.mark.usefixtures("quiet_redis")
def test_a_warning_among_mpiruns_first_lines_reaches_the_card_however_long_the_log_after_it(make_job):
    job = make_job(status=JobStatus.RUNNING, extra_args="--mca btl_tcp_if_include bogus0")
    store(job, [LogRecord(text=line, stream=LogStream.STDERR) for line in UNKNOWN_INTERFACE])
    store(job, [LogRecord(text=f"[host:1] mpirun's line {number}", stream=LogStream.STDERR) for number in range(600)])
    store(job, [rank_line(0, "step 1 loss=0.5")])

    card = record_failure(job.pk, "exit", 139, "", {}, (0, 0, 1, 1))

    assert card is not None and card["kind"] == "openmpi_options"
    assert "Unknown interface name" in TrainingJob.objects.get(pk=job.pk).failure["openmpi"][0]
