# Brings a job's object-store input to one worker's node, as the node's root, before its container starts.
# Usage: python3 stage-inputs.py WORKDIR CACHE_DIR CACHE_LIMIT_BYTES RESERVE_BYTES, with the manifest on stdin:
# a JSON list of {"path": "data_url_0/a/b", "url": presigned GET, "size": N, "cache_key": "..."}.
#
# Each object is fetched once per node into CACHE_DIR (root's alone), under a name made from the store, the
# key, its ETag and its size, and hard-linked into WORKDIR/inputs (root's, mounted read-only into the
# container): a rerun finds its objects there and fetches nothing. The console checked the user may read
# every object named (it listed them with the user's access and presigned each URL), so the cache never
# gives anyone an object their own access could not read. Progress lines go to stdout once a second.
import hashlib
import json
import os
import shutil
import sys
import time
import urllib.request

workdir, cache, cache_limit, reserve = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
items = json.load(sys.stdin)
root = os.path.join(workdir, "inputs")


def fail(message):
    print("error " + message, flush=True)
    sys.exit(3)


shutil.rmtree(root, ignore_errors=True)
os.makedirs(root, mode=0o755)
os.makedirs(cache, mode=0o700, exist_ok=True)
os.chmod(cache, 0o700)


def cached_name(item):
    return os.path.join(cache, hashlib.sha256(item["cache_key"].encode()).hexdigest())


def is_cached(item):
    name = cached_name(item)
    return os.path.isfile(name) and os.path.getsize(name) == item["size"]


missing = sum(item["size"] for item in items if not is_cached(item))
free = shutil.disk_usage(cache).free
if missing + reserve > free:
    fail(f"the input needs {missing} bytes more on this node, which has {free} free (and keeps {reserve} for itself)")

files = done = fetched = 0
started = last = time.monotonic()
for item in items:
    target = os.path.normpath(os.path.join(root, item["path"]))
    if not target.startswith(root + "/"):
        fail("an object's path leaves the input folder: {!r}".format(item["path"]))
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    name = cached_name(item)
    if is_cached(item):
        os.utime(name)  # the least recently used go first when the cache is full
    else:
        part = f"{name}.{os.getpid()}.part"  # nodes that share a disk may fetch the same object at once
        try:
            with urllib.request.urlopen(item["url"], timeout=60) as answer, open(part, "wb") as out:
                shutil.copyfileobj(answer, out, 1 << 20)
        except OSError as error:
            fail("fetching {}: {}".format(item["path"], error))
        if os.path.getsize(part) != item["size"]:
            fail(f"{item['path']} arrived with {os.path.getsize(part)} bytes, not {item['size']}")
        os.chmod(part, 0o644)
        os.replace(part, name)
        fetched += item["size"]
    os.link(name, target)
    files += 1
    done += item["size"]
    now = time.monotonic()
    if now - last >= 1:
        last = now
        print(f"progress files={files} bytes={done} fetched={fetched} seconds={now - started:.1f}", flush=True)

# The cache keeps at most cache_limit bytes: the least recently used objects go, never this job's.
wanted = {cached_name(item) for item in items}
entries = []
for entry in os.scandir(cache):
    if entry.is_file(follow_symlinks=False):
        info = entry.stat(follow_symlinks=False)
        entries.append((info.st_mtime, info.st_size, entry.path))
total = sum(size for _, size, _ in entries)
for _, size, path in sorted(entries):
    if total <= cache_limit:
        break
    if path not in wanted:
        os.unlink(path)
        total -= size
print(f"staged files={files} bytes={done} fetched={fetched} seconds={time.monotonic() - started:.1f}", flush=True)
