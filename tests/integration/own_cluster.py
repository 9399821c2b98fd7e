"""A local cluster of a test module's own, apart from the shared one: its own bridge, subnet and state.

Names and addresses are derived from TEST_RUN_ID, so concurrent runs on one machine stay apart.
"""

import os
import signal
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from jobs import localcluster

RUN_ID = int(os.environ.get("TEST_RUN_ID", "0"))


@dataclass
class OwnCluster:
    state_dir: Path
    options: dict
    nodes: list[localcluster.LocalNode]

    def stop_sshd(self, node_name: str, timeout: float = 10) -> None:
        """Ends one node's sshd, as when it dies on a real node, and waits until its port is closed."""
        entry = next(entry for entry in localcluster.status(self.state_dir) if entry.name == node_name)
        os.kill(entry.sshd_pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((entry.address, 22), timeout=0.5):
                    pass
            except OSError:
                return
            time.sleep(0.1)
        raise AssertionError(f"the sshd of {node_name} still answers")

    def restart_dead_sshds(self) -> None:
        localcluster.up(self.state_dir, len(self.nodes), **self.options)


@contextmanager
def own_cluster(tag: str, second_octet: int, nodes: int):
    """Brings up `nodes` nodes and takes them down afterwards, even after a failure."""
    options = {"subnet": f"10.{second_octet}.{RUN_ID}.0/24", "bridge": f"tc{tag}{RUN_ID}br",
               "prefix": f"tc{tag}{RUN_ID}n"}
    state_dir = Path(f"/var/lib/training-console/test-localcluster-{tag}")
    localcluster.down(state_dir, bridge=options["bridge"], prefix=options["prefix"])
    try:
        yield OwnCluster(state_dir, options, localcluster.up(state_dir, nodes, **options))
    finally:
        localcluster.down(state_dir, bridge=options["bridge"], prefix=options["prefix"])
