"""The seccomp profile of every worker's container: Podman's default, less new namespaces.

Podman's default profile lets `clone`, `clone3` and `unshare` make any namespace, a user namespace
included, and in a user namespace of its own a job's process holds every capability again (`unshare -Urm`
then mounts what it likes). Jobs need no namespace, so the job profile allows `clone` and `unshare` only
without a namespace flag, and answers `clone3` with ENOSYS: seccomp cannot read its flags (they sit in a
structure in memory), and ENOSYS is what makes glibc fall back to `clone` for threads and fork.

The shipped `seccomp-job.json` is this module's output for the default profile of Debian 12's Podman
(containers-common 0.50.1): `python -m jobs.runtime.seccomp /usr/share/containers/seccomp.json` makes it
again from a node's own default.
"""

import copy
import json
import sys
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET)
NEW_NAMESPACE_FLAGS = sum(NAMESPACE_FLAGS)
EPERM = 1
ENOSYS = 38
# Taken out of the default's plain "allow" rules, and given the rules below instead.
FILTERED = ("clone", "clone3", "unshare")

Profile = dict[str, Any]


def _namespace_rules(name: str) -> list[dict[str, Any]]:
    """Allowed without a namespace flag; EPERM (not the profile's default ENOSYS, which would say the call
    does not exist) with any. SCMP_CMP_MASKED_EQ: (argument & value) == valueTwo. The flags are the first
    argument of both calls on x86_64 and arm64 (s390x swaps clone's first two; its nodes are not supported)."""
    allowed = {"names": [name], "action": "SCMP_ACT_ALLOW",
               "args": [{"index": 0, "value": NEW_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
               "comment": "no new namespace: jobs need none, and a user namespace gives back every capability",
               "includes": {}, "excludes": {}}
    refused = [{"names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM,
                "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}],
                "comment": "", "includes": {}, "excludes": {}} for flag in NAMESPACE_FLAGS]
    return [allowed, *refused]


def job_profile(default: Profile) -> Profile:
    """The default profile with clone and unshare limited to no new namespace, and clone3 unknown."""
    profile = copy.deepcopy(default)
    rules = []
    for rule in profile["syscalls"]:
        names = rule["names"]
        if any(name in FILTERED for name in names):
            if rule["action"] != "SCMP_ACT_ALLOW":
                continue  # the default's own conditions on these calls (by capability) give way to ours
            rule["names"] = [name for name in names if name not in FILTERED]
            if not rule["names"]:
                continue
        rules.append(rule)
    rules += _namespace_rules("clone") + _namespace_rules("unshare")
    rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS,
                  "comment": "its flags cannot be filtered: glibc falls back to clone on ENOSYS",
                  "args": [], "includes": {}, "excludes": {}})
    profile["syscalls"] = rules
    return profile


if __name__ == "__main__":
    with open(sys.argv[1]) as default_file:
        json.dump(job_profile(json.load(default_file)), sys.stdout, indent=1)
        sys.stdout.write("\n")
