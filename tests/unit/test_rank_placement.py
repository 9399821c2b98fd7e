"""Where mpirun puts each rank (jobs.launch.plan.rank_workers), read from the job's mpirun options."""

import pytest

from jobs.launch.plan import rank_workers


@pytest.mark.parametrize("options, placement", [
    ("", (0, 0, 1, 1)),
    ("-bind-to none -map-by slot", (0, 0, 1, 1)),
    ("-bind-to none -map-by node", (0, 1, 0, 1)),
    ("--map-by=node:PE=1", (0, 1, 0, 1)),
    ("-map-by", (0, 0, 1, 1)),
])
def test_ranks_fill_each_workers_slots_in_turn_unless_mpirun_is_told_to_map_by_node(options, placement):
    assert rank_workers(options, processes_per_node=2, node_count=2) == placement


@pytest.mark.parametrize(("extra", "named"), [
    ("--rank-by node", "--rank-by"), ("--map-by node:span", "node:span"), ("--map-by slot:PE=2,SPAN", "SPAN"),
    ("--mca rmaps_base_mapping_policy node", "rmaps_base_mapping_policy"), ("-bynode", "-bynode")])
def test_what_would_place_ranks_otherwise_than_the_plan_knows_is_refused_even_to_an_administrator(extra, named):
    # The log's worker view and the failure card put each rank where the plan says it runs.
    from jobs.launch.command_builder import CommandError, allowed_options, check_mpirun_options, validate_extra_args

    with pytest.raises(CommandError) as by_a_user:
        validate_extra_args(extra, allowed_options("--mca .*"))
    with pytest.raises(CommandError) as in_the_defaults:
        check_mpirun_options("bind_args", extra)
    assert named in by_a_user.value.message and named in in_the_defaults.value.message


@pytest.mark.parametrize("line", ["--rank-by (slot|node)", "-bynode"])
def test_an_administrator_cannot_allow_what_reorders_the_ranks(line):
    from jobs.launch.command_builder import CommandError, allowed_options

    with pytest.raises(CommandError, match="cannot be allowed"):
        allowed_options(line)
