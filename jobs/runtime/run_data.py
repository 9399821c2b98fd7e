"""A run's data steps: what each worker's node fetches before the start (the input, train_url's files, the
checkpoint an attempt resumes from), train_url uploaded while the job runs and once more at its end, and the
checkpoint contract (jobs.launch.checkpoint_contract): the program's manifest watched, each checkpoint
recorded once it is in the store, and the notice before a stop.

JobRun (jobs.runtime.run) takes these steps from RunData; they share its state (the plan, the uploads).
"""

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from jobs.launch.plan import JobPlan
from jobs.models import JobEvent
from jobs.object_store.client import StoreError
from jobs.object_store.urls import ObjectUrlError
from jobs.results.checkpoints import (
    claim_notice,
    last_claim,
    note_notice,
    record_checkpoint,
    warn_checkpoint,
)
from jobs.results.outputs import record_outputs
from jobs.runtime.checkpoints import CheckpointWatch, FoundCheckpoint, signal_ranks
from jobs.runtime.data_in import (
    OUTPUTS_TARGET,
    PREDOWNLOADED_MTIME_NS,
    Download,
    Staging,
    checkpoint_downloads,
    input_downloads,
    output_downloads,
)
from jobs.runtime.data_out import OutputSync, describe_reach_error, output_reach
from jobs.runtime.ssh import NodeError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The pauses between the tries of a job's last upload (within OUTPUT_FINAL_SYNC_SECONDS).
FINAL_UPLOAD_PAUSES = (2.0, 5.0)
# How often a notice's grace looks for the checkpoint it asked for.
CHECKPOINT_NOTICE_LOOK_SECONDS = 1.0
# What a stop needs after its notice to end the ranks and the containers, where its nodes are taken back at a
# known time (a Slurm preemption's grace): the notice ends this much before.
NOTICE_TEARDOWN_SECONDS = 10.0


async def in_database(function: Callable[..., T], *args: object) -> T:
    """Run a database step in this run's own thread (see jobs.runtime.run's docstring)."""
    return await sync_to_async(function)(*args)


def job_event(job_id: int, kind: str, message: str) -> None:
    JobEvent.objects.create(job_id=job_id, kind=kind, message=message)


class RunData:
    """The data steps of a run (see the module's docstring)."""

    plan: JobPlan
    job_id: int
    # Workers lost mid-run, and those whose node stopped answering (no upload waits on them).
    lost: dict[int, str]
    unreachable: frozenset[int]

    def __init__(self) -> None:
        # The uploads of an object-store train_url (None: the job has none, or it is not known yet).
        self.output_sync: OutputSync | None = None
        # The program's checkpoints, read from its manifest (None: its train_url is not in an object store).
        self.checkpoint_watch: CheckpointWatch | None = None
        # The last upload is done: nothing is looked for any more.
        self.outputs_done = False

    async def say(self, text: str, worker_index: int | None = None) -> None:
        raise NotImplementedError

    async def give_notice(self) -> None:
        """The job's notice before a stop: its signal to every rank, then up to its grace for a checkpoint (the
        stop goes on as soon as one is in the store); a rank still running at the grace's end is ended."""
        if self.plan.checkpoint_grace_seconds <= 0 or self.lost:
            return
        signal = self.plan.checkpoint_signal
        notice = await in_database(claim_notice, self.job_id, self.plan.checkpoint_grace_seconds,
                                   NOTICE_TEARDOWN_SECONDS)
        sent_at, grace = notice.sent_at, notice.grace
        if grace <= 0:
            await self.say("No time for a notice: the nodes are taken back before a checkpoint could be saved")
            return
        if notice.ours:
            count = await signal_ranks(self.plan, signal)
            cut = "" if grace == self.plan.checkpoint_grace_seconds else " (cut short: the nodes are taken back)"
            await in_database(note_notice, self.job_id,
                              f"Notice: SIG{signal} sent to {count} rank(s); up to {grace} s to save a checkpoint{cut}")
        loop = asyncio.get_running_loop()
        # From when it went out (by this process, or by the one that ran the job before it).
        deadline = loop.time() + grace - max((timezone.now() - sent_at).total_seconds(), 0.0)
        while (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(CHECKPOINT_NOTICE_LOOK_SECONDS, left))
            try:
                # Within the grace: a slow upload does not hold the ranks' end back.
                async with asyncio.timeout(max(deadline - loop.time(), 0.1)):
                    found = await self.look_for_checkpoint()
            except TimeoutError:
                break
            # Recorded by this look, or by the periodic one meanwhile.
            watch = self.checkpoint_watch
            if found or (watch is not None and watch.recorded_at is not None and watch.recorded_at >= sent_at):
                return
        await self.say(f"No checkpoint within the {grace} s grace: ending the ranks")
        await signal_ranks(self.plan, "TERM")

    async def look_for_checkpoint(self) -> bool:
        """One look at the program's manifest; True when a new checkpoint was recorded."""
        if self.checkpoint_watch is None:
            return False
        try:
            return await self.checkpoint_watch.look()
        except NodeError as error:
            logger.info("job %s: a look for a checkpoint failed (tried again): %s", self.job_id, error)
            return False
        except Exception:  # what the job wrote must never end the watch for the rest of the run
            logger.exception("job %s: a look for a checkpoint failed (tried again)", self.job_id)
            return False

    async def watch_checkpoints_while_running(self) -> None:
        """Look for a new checkpoint every CHECKPOINT_LOOK_SECONDS while the job runs: it is uploaded and recorded
        at once, so a lost worker or a preemption loses no more than the program's own interval."""
        while self.plan.keeps_checkpoints:
            await asyncio.sleep(settings.CHECKPOINT_LOOK_SECONDS)
            if self.outputs_done:
                return  # the last upload is done
            await self.look_for_checkpoint()  # nothing yet while the store is being found (a run taken up again)

    async def record_checkpoint(self, found: FoundCheckpoint) -> None:
        await in_database(record_checkpoint, self.job_id, found.claim, found.url, found.size_bytes, found.file_count)

    async def warn_checkpoint(self, reason: str) -> None:
        await in_database(warn_checkpoint, self.job_id, reason)

    async def stagings(self) -> list[Staging]:
        """What each worker's node fetches before its container starts: the input, and train_url's files when
        the job brings them back (each attempt, so a restarted program resumes from its last checkpoint)."""
        found = []
        if self.plan.stages_inputs:
            found.append(Staging(tuple(await in_database(input_downloads, self.job_id))))
        if self.plan.predownloads_output:
            brought = await in_database(output_downloads, self.job_id)
            if brought:
                found.append(Staging(tuple(brought), target=OUTPUTS_TARGET, owned=True, what="train_url"))
                self.not_again(brought)
        # The checkpoint to resume from, unless it came back with train_url already: in this job's own train_url
        # (then, unchanged, it is not uploaded again), or another's (a Rebuild's source): then it is this job's
        # output only once the program rewrites it.
        own = self.output_sync is not None and \
            self.plan.resume_url.startswith(self.output_sync.train_url.rstrip("/") + "/")
        if self.plan.resume_url and not (self.plan.predownloads_output and own):
            brought = await in_database(checkpoint_downloads, self.job_id, self.plan.resume_url, self.plan.resume_from)
            found.append(Staging(tuple(brought), target=OUTPUTS_TARGET, owned=True, what="checkpoint"))
            if own:
                self.not_again(brought)
        return found

    def not_again(self, brought: list[Download]) -> None:
        """Files brought back into the output folder: unchanged since, they are not uploaded again."""
        if self.output_sync is not None:
            self.output_sync.sent.update({item.path.split("/", 1)[1]: (item.size, PREDOWNLOADED_MTIME_NS)
                                          for item in brought})

    async def find_output_store(self) -> None:
        try:
            found = await in_database(output_reach, self.job_id)
        except (ObjectUrlError, StoreError) as error:
            # Checked at submission; a store removed or refused since fails the upload, not the job.
            await in_database(record_outputs, self.job_id, "", describe_reach_error(error))
            return
        if found is not None:
            train_url, where = found
            self.output_sync = OutputSync(train_url, where, self.plan.container_target(self.plan.workers[0]),
                                          job_id=self.job_id)
            if self.plan.keeps_checkpoints:
                self.checkpoint_watch = CheckpointWatch(self.output_sync, self.record_checkpoint, self.warn_checkpoint)
                # A run taken up again does not record again what the one before it recorded.
                self.checkpoint_watch.settled = await in_database(last_claim, self.job_id)

    async def sync_outputs_while_running(self) -> None:
        """Upload what changed in the output folder every OUTPUT_SYNC_SECONDS, for as long as the job runs."""
        if self.output_sync is None:
            await self.find_output_store()  # a run taken up again by another process
        while self.output_sync is not None:
            await asyncio.sleep(settings.OUTPUT_SYNC_SECONDS)
            try:
                await self.output_sync.sync()
            except NodeError as error:
                logger.info("job %s: an output upload failed (tried again at the next): %s", self.job_id, error)
                continue
            await in_database(record_outputs, self.job_id, self.output_sync.train_url, self.output_sync.result())

    async def upload_outputs_before_the_end(self) -> None:
        """The last upload, while worker-0's container is still up (a stop waits for it, within a bound)."""
        sync = self.output_sync
        if sync is None or 0 in self.unreachable:
            return
        await self.say(f"Uploading the outputs to {sync.train_url}")
        problem = ""
        try:
            async with asyncio.timeout(settings.OUTPUT_FINAL_SYNC_SECONDS):
                # A store that is briefly away (a restart, a network blip) gets a few more tries.
                for pause in (*FINAL_UPLOAD_PAUSES, None):
                    try:
                        await sync.sync()
                        problem = ""
                    except NodeError as error:
                        problem = error.reason
                    if pause is None or not (problem or sync.failed):
                        break
                    await asyncio.sleep(pause)
        except TimeoutError:
            problem = f"the upload took longer than {settings.OUTPUT_FINAL_SYNC_SECONDS} s"
        if not problem:
            await self.look_for_checkpoint()  # one saved at the very end (a notice answered by exiting)
        result = sync.result(problem)
        await in_database(record_outputs, self.job_id, sync.train_url, result)
        await in_database(job_event, self.job_id, "outputs", result.message)
        await self.say(result.message)
        self.output_sync = None  # uploaded for the last time: the end does not do it again
        self.checkpoint_watch = None
        self.outputs_done = True
