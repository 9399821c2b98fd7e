# Uploads the files the console names from a job's output folder, inside its worker-0 container, as the
# job's user, each to its presigned PUT URL; the manifest comes on stdin: a JSON list of
# {"path": relative path, "url": presigned PUT}. One JSON line per file: {"path", "size"} or {"path", "error"}.
# Usage: python3 -c "$(cat outputs-upload.py)" FOLDER
import http.client
import json
import os
import sys
import urllib.request

folder = sys.argv[1]
for item in json.load(sys.stdin):
    path = os.path.join(folder, item["path"])
    try:
        # O_NOFOLLOW: a file swapped for a link since the listing is not followed.
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(descriptor, "rb") as source:
            size = os.fstat(source.fileno()).st_size
            request = urllib.request.Request(item["url"], data=source, method="PUT",
                                             headers={"Content-Length": str(size)})
            with urllib.request.urlopen(request, timeout=120) as answer:
                answer.read()
        print(json.dumps({"path": item["path"], "size": size}), flush=True)
    except (OSError, ValueError, http.client.HTTPException) as error:
        print(json.dumps({"path": item["path"], "error": str(error)[:300]}), flush=True)
