"""`tc data`: the user's own bucket in the console's object stores (what s3:// and obs:// data_url and
train_url name). The console signs a link for each file; the bytes go between this machine and the store."""

import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath

from .api import Client
from .documents import dumps
from .errors import BadInput, CliError

LINKS_A_REQUEST = 1000
STORE_TIMEOUT_SECONDS = 600


def _store(url: str, path: Path) -> None:
    """One file PUT to the store itself (no token: the signed URL is the permission); a 5xx is tried again, as
    S3 clients do (a store that restarts answers 500 for a few seconds)."""
    for pause in (1, 2, 4, None):
        try:
            with open(path, "rb") as body:
                request = urllib.request.Request(url, data=body, method="PUT",
                                                 headers={"Content-Length": str(path.stat().st_size)})
                with urllib.request.urlopen(request, timeout=STORE_TIMEOUT_SECONDS) as answer:
                    answer.read()
            return
        except urllib.error.HTTPError as error:
            if error.code < 500 or pause is None:
                raise CliError(f"the object store refused PUT (HTTP {error.code})") from None
        except (urllib.error.URLError, OSError) as error:
            raise CliError(f"cannot reach the object store: {getattr(error, 'reason', error)}") from None
        time.sleep(pause)


def folder_url(url: str) -> str:
    return url if url.endswith("/") else url + "/"


def cmd_ls(client: Client, url: str, as_json: bool) -> int:
    answer = client.get("data", url=url or None)
    if as_json:
        print(dumps(answer))
        return 0
    if not url:
        for bucket in answer["buckets"]:
            print(f"{bucket['url']}  ({bucket['storage']})")
        return 0
    for folder in answer["folders"]:
        print(f"{'':>12}  {folder}")
    for item in answer["objects"]:
        print(f"{item['size']:>12}  {answer['url']}{item['name']}")
    if answer["more"]:
        print("(more: tc data ls --json and `after`)", file=sys.stderr)
    return 0


def files_under(folder: Path) -> list[tuple[str, Path]]:
    found = []
    for top, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = Path(top) / name
            if path.is_file() and not path.is_symlink():
                found.append((path.relative_to(folder).as_posix(), path))
    return found


def cmd_push(client: Client, source: str, url: str) -> int:
    folder = Path(source).expanduser()
    if not folder.is_dir():
        raise BadInput(f"{source} is not a folder")
    files = files_under(folder)
    if not files:
        raise BadInput(f"{source} holds no file")
    sent = 0
    for start in range(0, len(files), LINKS_A_REQUEST):
        batch = files[start:start + LINKS_A_REQUEST]
        links = client.post("data/upload-links", {"url": folder_url(url), "paths": [path for path, _ in batch]})
        local = dict(batch)
        for link in links["links"]:
            path = local[link["path"]]
            _store(link["url"], path)
            sent += path.stat().st_size
    print(f"Uploaded {len(files)} file(s), {sent} bytes, to {folder_url(url)}")
    return 0


def _objects(client: Client, url: str) -> list[tuple[str, str]]:
    """(path under url, object URL) of every object under the folder url, sub-folders included."""
    found, pending = [], [folder_url(url)]
    while pending:
        folder, after = pending.pop(), ""
        while True:
            answer = client.get("data", url=folder, after=after or None)
            pending.extend(answer["folders"])
            relative = folder[len(folder_url(url)):]
            found += [(relative + item["name"], answer["url"] + item["name"]) for item in answer["objects"]]
            if not answer["more"] or not answer["objects"]:
                break
            after = answer["objects"][-1]["key"]
    return found


def safe_path(root: Path, path: str) -> Path:
    relative = PurePosixPath(path)
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise CliError(f"the store named a file outside the folder: {path!r}")
    return root.joinpath(*relative.parts)


def cmd_get(client: Client, url: str, destination: str) -> int:
    root = Path(destination).expanduser()
    objects = _objects(client, url) if url.endswith("/") else [(PurePosixPath(url).name, url)]
    for path, object_url in objects:
        link = client.get("data/download-link", url=object_url)
        target = safe_path(root, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with urllib.request.urlopen(link["url"], timeout=STORE_TIMEOUT_SECONDS) as answer, open(target, "wb") as out:
                while chunk := answer.read(1 << 20):
                    out.write(chunk)
        except (urllib.error.URLError, OSError) as error:
            raise CliError(f"fetching {object_url}: {getattr(error, 'reason', error)}") from None
    print(f"Saved {len(objects)} file(s) under {root}")
    return 0
