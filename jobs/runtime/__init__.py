"""The job on the nodes: SSH, containers, the launch, its monitor, the teardown, the reaper, node health.

The only package that talks to nodes (asyncssh), and the only one jobs.tasks calls into.
"""
