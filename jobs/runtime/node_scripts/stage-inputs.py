# Brings a job's object-store input to one worker's node, as the node's root, before its container starts.
# Usage: python3 stage-inputs.py WORKDIR CACHE_DIR CACHE_LIMIT_BYTES RESERVE_BYTES [TARGET OWNER_UID], with the
# manifest on stdin: a JSON list of {"path": "data_url_0/a/b", "url": presigned GET, "size": N, "cache_key": "...",
# "check_access": bool}.
# With TARGET and OWNER_UID (a train_url brought back to resume from), the objects are copied under
# WORKDIR/TARGET instead (the job's home, still root's: prepare-workdir.sh gives it to OWNER_UID after),
# each with the modification time PREDOWNLOADED_MTIME_NS, which tells the output's upload they came from
# the bucket unchanged.
#
# Each object is fetched once per node into CACHE_DIR (root's alone), under a name made from the store, the
# key, its ETag and its size, and hard-linked into WORKDIR/inputs (root's, mounted read-only into the
# container): a rerun finds its objects there and fetches nothing. The console checked the user may read
# every object named (it listed them with the user's access and presigned each URL), so the cache never
# gives anyone an object their own access could not read. Keys a user brought may list what they may not
# read: an object marked check_access is taken from the cache only once the store answered its URL (the
# first byte of it). Progress lines go to stdout once a second.
import concurrent.futures
import hashlib
import http.client
import json
import os
import shutil
import sys
import threading
import time
import urllib.request

workdir, cache, cache_limit, reserve = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
target_dir, owner = (sys.argv[5], int(sys.argv[6])) if len(sys.argv) > 6 else ("inputs", None)
PREDOWNLOADED_MTIME_NS = 1_000_000_000
# Objects fetched at once: one stream rarely fills a node's link to the store.
FETCHERS = 4
items = json.load(sys.stdin)
root = os.path.join(workdir, target_dir)


def fail(message):
    print("error " + message, flush=True)
    sys.exit(3)


if owner is None:
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root, mode=0o755)
elif os.path.islink(root) or not os.path.isdir(root):
    fail("the output folder is not a folder")
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



class Failure(Exception):
    pass


def place(source, target):
    """The object at its path in the worker's folder: linked (the input), or copied as the job's (the output)."""
    if owner is None:
        os.link(source, target)
    else:
        # A copy, never a link: home becomes the job's uid's next (prepare-workdir.sh own), and a linked cache
        # entry would then be the job's to change under every later job that reads it.
        shutil.copyfile(source, target, follow_symlinks=False)
        os.utime(target, ns=(PREDOWNLOADED_MTIME_NS, PREDOWNLOADED_MTIME_NS))


def store_answers(item):
    """Whether the store gives this object to the item's URL (whose keys signed it): one byte asked for."""
    request = urllib.request.Request(item["url"], headers={"Range": "bytes=0-0"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            answer.read(1)
    except (OSError, http.client.HTTPException):
        return False
    return True


def fetch(item, target):
    """Place one object, from the cache when it is there (and its URL still answers, where it must be checked);
    the bytes fetched from the store."""
    name = cached_name(item)
    if is_cached(item) and (not item.get("check_access") or store_answers(item)):
        try:
            os.utime(name)  # the least recently used go first when the cache is full
            place(name, target)
            return 0
        except FileNotFoundError:
            pass  # the entry went meanwhile (another job's clean-up): fetch it again
    # Nodes that share a disk, or two jobs of one node, may fetch the same object at once: each fetches into
    # a file of its own, places that, then offers it to the cache, where the first one in stays.
    part = f"{name}.{os.getpid()}.{threading.get_ident()}.part"
    try:
        with urllib.request.urlopen(item["url"], timeout=60) as answer, open(part, "wb") as out:
            shutil.copyfileobj(answer, out, 1 << 20)
        if os.path.getsize(part) != item["size"]:
            raise Failure(f"{item['path']} arrived with {os.path.getsize(part)} bytes, not {item['size']}")
        os.chmod(part, 0o644)
        place(part, target)
        try:
            os.link(part, name)
        except FileExistsError:
            pass
    except (OSError, http.client.HTTPException) as error:
        raise Failure(f"fetching {item['path']}: {error}") from error
    finally:
        if os.path.exists(part):
            os.unlink(part)
    return item["size"]


# Every path is checked and its folders made first, in order, before several objects are fetched at once.
targets = []
for item in items:
    target = os.path.normpath(os.path.join(root, item["path"]))
    if not target.startswith(root + "/"):
        fail("an object's path leaves the input folder: {!r}".format(item["path"]))
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    targets.append(target)

files = done = fetched = 0
started = last = time.monotonic()
with concurrent.futures.ThreadPoolExecutor(FETCHERS) as pool:
    running = {pool.submit(fetch, item, target): item for item, target in zip(items, targets, strict=True)}
    try:
        for finished in concurrent.futures.as_completed(running):
            fetched += finished.result()
            files += 1
            done += running[finished]["size"]
            now = time.monotonic()
            if now - last >= 1:
                last = now
                print(f"progress files={files} bytes={done} fetched={fetched} seconds={now - started:.1f}", flush=True)
    except Failure as error:
        for future in running:
            future.cancel()
        fail(str(error))

# The cache keeps at most cache_limit bytes: the least recently used objects go, never this job's.
wanted = {cached_name(item) for item in items}
entries = []
for entry in os.scandir(cache):
    if entry.is_file(follow_symlinks=False) and not entry.name.endswith(".part"):  # another's fetch under way
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
