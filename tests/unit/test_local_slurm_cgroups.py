"""A local Slurm taken down removes the empty cgroup folders its jobs left on its nodes, and no other instance's."""

from jobs.localslurm import JOB_ID_SPAN, Ports, first_job_id, remove_job_cgroups


def test_a_local_slurm_taken_down_removes_its_jobs_empty_cgroups_and_leaves_the_rest(tmp_path):
    first = first_job_id(Ports.from_base(18310))
    ended = tmp_path / "freezer" / "slurm_node-0" / "uid_1001" / f"job_{first + 4}"
    (ended / "step_0").mkdir(parents=True)
    (tmp_path / "memory" / "slurm_node-1" / "uid_1001" / f"job_{first + 4}" / "step_0" / "task_1").mkdir(parents=True)
    # A folder with something in it stands for a cgroup a process is still in: rmdir refuses it.
    busy = tmp_path / "memory" / "slurm_node-0" / "uid_1001" / f"job_{first + 7}" / "step_0"
    busy.mkdir(parents=True)
    (busy / "cgroup.procs").write_text("4242\n")
    others = tmp_path / "freezer" / "slurm_node-0" / "uid_1001" / f"job_{first + JOB_ID_SPAN}"
    others.mkdir(parents=True)

    left = remove_job_cgroups(first, root=tmp_path)

    assert not ended.exists() and not (tmp_path / "memory" / "slurm_node-1" / "uid_1001" / f"job_{first + 4}").exists()
    assert left == [str(busy), str(busy.parent)] and busy.is_dir()
    assert others.is_dir(), "another instance's job ids are not this one's"
