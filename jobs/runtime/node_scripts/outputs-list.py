# Lists a job's output folder inside its worker-0 container, as the job's user: one JSON list of
# [path relative to the folder, size, modification time in ns] for each regular file (links are not
# followed: they could lead anywhere the job's user can read, and what is uploaded is what the job wrote).
# Usage: python3 -c "$(cat outputs-list.py)" FOLDER LIMIT
import json
import os
import stat
import sys

folder, limit = sys.argv[1], int(sys.argv[2])
found: list[list[object]] = []
more = False
for top, dirs, names in os.walk(folder):
    dirs[:] = sorted(name for name in dirs if not os.path.islink(os.path.join(top, name)))
    for name in sorted(names):
        path = os.path.join(top, name)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue  # gone since the walk (a file written aside, then renamed): the next look sees what it became
        if stat.S_ISREG(info.st_mode):
            if len(found) == limit:
                more = True  # the first `limit` files are uploaded; the console says the rest were not
                break
            found.append([os.path.relpath(path, folder), info.st_size, info.st_mtime_ns])
print(json.dumps({"files": found, "more": more}))
