# Uploads the files the console names from a job's output folder, inside its worker-0 container, as the
# job's user, each to its presigned PUT URL, or in parts to one URL a part; the manifest comes on stdin: a JSON
# list of {"path": relative path, "url": presigned PUT} or {"path", "parts": {"size", "part_bytes", "urls"}}.
# One JSON line per file: {"path", "size"}, {"path", "size", "etags": [one a part]} or {"path", "error"}.
# Usage: python3 -c "$(cat outputs-upload.py)" FOLDER
import http.client
import json
import os
import sys
import urllib.request


class Part:
    """`length` bytes of an open file from where it stands: a part's body, read as it is sent."""

    def __init__(self, source, length):
        self.source, self.left = source, length

    def read(self, amount=-1):
        amount = self.left if amount is None or amount < 0 else min(amount, self.left)
        data = self.source.read(amount)
        self.left -= len(data)
        return data


def put(url, body, length):
    request = urllib.request.Request(url, data=body, method="PUT", headers={"Content-Length": str(length)})
    with urllib.request.urlopen(request, timeout=120) as answer:
        answer.read()
        return answer.headers.get("ETag", "")


def upload_parts(source, size, parts):
    if size < parts["size"]:
        # The parts were cut for the size at the listing: the next look uploads the file as it is then.
        raise ValueError(f"it shrank while it was being uploaded ({parts['size']} bytes, then {size})")
    # A file that grew since (a log, an event file) is sent as it was at the listing's size: its first bytes,
    # and its changed time has the next look send it whole.
    size = parts["size"]
    etags = []
    for number, url in enumerate(parts["urls"]):
        offset = number * parts["part_bytes"]
        length = min(parts["part_bytes"], size - offset)
        source.seek(offset)
        etags.append(put(url, Part(source, length), length))
    return etags


folder = sys.argv[1]
for item in json.load(sys.stdin):
    path = os.path.join(folder, item["path"])
    try:
        # O_NOFOLLOW: a file swapped for a link since the listing is not followed.
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(descriptor, "rb") as source:
            size = os.fstat(source.fileno()).st_size
            if "parts" in item:
                etags = upload_parts(source, size, item["parts"])
                print(json.dumps({"path": item["path"], "size": item["parts"]["size"], "etags": etags}), flush=True)
                continue
            put(item["url"], source, size)
        print(json.dumps({"path": item["path"], "size": size}), flush=True)
    except (OSError, ValueError, http.client.HTTPException) as error:
        print(json.dumps({"path": item["path"], "error": str(error)[:300]}), flush=True)
