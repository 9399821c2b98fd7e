"""A job's evidence bundle: what was seen inside it when it failed or its watchdog fired, as one typed JSON
document (EvidenceBundle.content). Built here from what the console keeps (the stored log, the job's command
and environment, its nodes' facts) and the live ranks' stacks the runtime took (jobs.runtime.evidence)."""

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TypedDict

from jobs.launch.masking import mask_shell_text, masked
from jobs.models import EvidenceBundle, LogLine, TrainingJob, Worker

# The last lines kept of each rank, and the ranks that many are kept of (a job of thousands of ranks keeps the
# first ones': rank 0 and its neighbours say most).
LAST_LINES_PER_RANK = 50
RANKS_KEPT = 64
# A rank's stacks as py-spy prints them, at most (a deep recursion prints thousands of frames).
STACK_MAX_CHARS = 20000
# Why a bundle was taken.
REASON_FAILURE = "failure"
REASON_WATCHDOG = "watchdog"
# The header the stacks script prints before each rank's dump (node_scripts/rank-stacks.sh).
RANK_HEADER = re.compile(r"^@@ rank=(\d+) pid=(\d+)$")
# Each line of a dump, as the stacks script passes it on (jobs/runtime/node_scripts/rank-stacks.sh).
DUMP_LINE = "| "


class RankLastLines(TypedDict):
    rank: int
    lines: list[str]


class RankStack(TypedDict):
    rank: int
    pid: int
    ok: bool  # py-spy printed the stacks; otherwise `stack` says why not
    stack: str


class WorkerStacks(TypedDict):
    worker: int
    node: str
    ranks: list[RankStack]
    problem: str  # "" or why no stacks could be taken in this worker's container


class NodeEvidence(TypedDict):
    worker: int
    node: str
    address: str
    facts: dict[str, object]  # what the node's last health check found (jobs.node_facts.NodeFacts)


class EvidenceContent(TypedDict):
    reason: str
    attempt: int
    status: str
    status_message: str
    command: str
    environment: dict[str, str]
    last_lines: list[RankLastLines]
    stacks: list[WorkerStacks]
    nodes: list[NodeEvidence]


def parse_rank_stacks(output: str) -> list[RankStack]:
    """The stacks script's output: per live Python rank, a header then py-spy's dump (or why it failed)."""
    stacks: list[RankStack] = []
    failed: list[bool] = []
    for line in output.splitlines():
        header = RANK_HEADER.match(line)
        if header:
            stacks.append(RankStack(rank=int(header.group(1)), pid=int(header.group(2)), ok=True, stack=""))
            failed.append(False)
        elif stacks and line.startswith(DUMP_LINE):
            # What py-spy printed (a rank's own words among it: never taken for the script's).
            stacks[-1]["stack"] += line.removeprefix(DUMP_LINE) + "\n"
        elif stacks and line.startswith("py-spy failed"):
            stacks[-1]["stack"] += line + "\n"
            failed[-1] = True
    for stack, dump_failed in zip(stacks, failed, strict=True):
        text = stack["stack"].strip()
        stack["ok"] = not dump_failed and bool(text)
        stack["stack"] = text[:STACK_MAX_CHARS] or "py-spy printed nothing"
    return stacks


def masked_environment(env: Mapping[str, object]) -> dict[str, str]:
    """The job's variables as anyone but their owner sees them: values that look secret masked."""
    return {name: masked(name, str(value)) for name, value in sorted(env.items())}


def last_lines_by_rank(lines: Iterable[tuple[int, str]], per_rank: int = LAST_LINES_PER_RANK) -> list[RankLastLines]:
    """Each rank's last `per_rank` lines, from (rank, text) pairs in log order."""
    kept: dict[int, list[str]] = {}
    for rank, text in lines:
        kept.setdefault(rank, []).append(text)
    return [RankLastLines(rank=rank, lines=texts[-per_rank:]) for rank, texts in sorted(kept.items())]


def stored_last_lines(job_id: int, rank_count: int) -> list[RankLastLines]:
    """Each rank's last lines from the job's stored log (the newest LAST_LINES_PER_RANK of the first RANKS_KEPT)."""
    pairs: list[tuple[int, str]] = []
    for rank in range(min(rank_count, RANKS_KEPT)):
        newest = (LogLine.objects.filter(job_id=job_id, rank=rank).order_by("-seq")
                  .values_list("text", flat=True)[:LAST_LINES_PER_RANK])
        pairs.extend((rank, text) for text in reversed(list(newest)))
    return last_lines_by_rank(pairs)


def nodes_of(job_id: int) -> list[NodeEvidence]:
    workers = Worker.objects.filter(job_id=job_id).select_related("node").order_by("index")
    return [NodeEvidence(worker=worker.index, node=worker.node.name if worker.node else worker.node_name,
                         address=worker.node.address if worker.node else "",
                         facts=worker.node.health if worker.node else {})
            for worker in workers]


def evidence_content(job: TrainingJob, reason: str, rank_count: int, stacks: Sequence[WorkerStacks]) -> EvidenceContent:
    return EvidenceContent(
        reason=reason, attempt=job.attempt, status=job.status, status_message=job.status_message,
        command=mask_shell_text(job.command), environment=masked_environment(job.env or {}),
        last_lines=stored_last_lines(job.pk, rank_count), stacks=list(stacks), nodes=nodes_of(job.pk),
    )


def has_bundle(job_id: int, attempt: int, reason: str) -> bool:
    return EvidenceBundle.objects.filter(job_id=job_id, attempt=attempt, reason=reason).exists()


def keep_bundle(job: TrainingJob, content: EvidenceContent) -> EvidenceBundle:
    return EvidenceBundle.objects.create(job=job, attempt=content["attempt"], reason=content["reason"], content=content)
