# Lists a job's output folder inside its worker-0 container, as the job's user: one JSON list of
# [path relative to the folder, size, modification time in ns] for each regular file (links are not
# followed: they could lead anywhere the job's user can read, and what is uploaded is what the job wrote).
# Usage: python3 -c "$(cat outputs-list.py)" FOLDER LIMIT
import json
import os
import stat
import sys

folder, limit = sys.argv[1], int(sys.argv[2])
found = []
for top, dirs, names in os.walk(folder):
    dirs[:] = [name for name in dirs if not os.path.islink(os.path.join(top, name))]
    for name in names:
        path = os.path.join(top, name)
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode):
            found.append([os.path.relpath(path, folder), info.st_size, info.st_mtime_ns])
            if len(found) > limit:
                print(json.dumps({"error": f"more than {limit} files"}))
                sys.exit(0)
print(json.dumps({"files": found}))
