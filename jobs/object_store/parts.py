"""How a large file is cut for a multipart upload, and which ETags a node may hand back for its parts.

Plain values only: the upload (jobs.runtime.data_out) asks the store, this says how many parts and which
answers stand. The limits are S3's, which OBS and SeaweedFS share: a part is at least 5 MiB (but the last),
an upload has at most 10,000 parts, and one PUT takes at most 5 GiB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 1024 * 1024
SMALLEST_PART_BYTES = 5 * MIB
MOST_PARTS = 10_000
LARGEST_SINGLE_PUT_BYTES = 5 * 1024 * MIB
# An object store's ETag for one part: an MD5 in hex on S3, OBS and SeaweedFS, quoted; a little more is allowed
# (other stores), never a quote, a space or a control inside (what the node says is the job's own text).
PART_ETAG = re.compile(r'"?[0-9A-Za-z+/=_.:-]{1,128}"?')


@dataclass(frozen=True)
class PartPlan:
    part_bytes: int
    count: int


def part_plan(size: int, part_bytes: int) -> PartPlan | None:
    """The parts of a file of `size` bytes with parts of `part_bytes` (the setting), grown in whole MiB so that no
    file needs more than MOST_PARTS; None when the file goes in one PUT (it is not larger than one part)."""
    # A part is also one PUT: never past what one PUT takes, whatever the setting says.
    part_bytes = min(max(part_bytes, SMALLEST_PART_BYTES), LARGEST_SINGLE_PUT_BYTES)
    if size <= part_bytes:
        return None
    if size > part_bytes * MOST_PARTS:
        needed = -(-size // MOST_PARTS)
        part_bytes = -(-needed // MIB) * MIB
    return PartPlan(part_bytes, -(-size // part_bytes))


def parts_taken(answer: object, plan: PartPlan) -> list[str] | None:
    """The parts' ETags, quoted as the store wants them back, when `answer` is one for each part of the plan and
    each is an ETag; None otherwise (the upload is then aborted, never completed with what a job made up)."""
    if not isinstance(answer, list) or len(answer) != plan.count:
        return None
    if not all(isinstance(etag, str) and PART_ETAG.fullmatch(etag) for etag in answer):
        return None
    return [f'"{etag.strip(chr(34))}"' for etag in answer]
