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
