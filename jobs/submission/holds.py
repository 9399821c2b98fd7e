"""A failed job held for debugging, seen from its owner: "release now" ends the hold at once, and the job's
evidence bundles are theirs alone (anyone else, staff included, is told there is no such job)."""

from django.db.models import QuerySet
from django.http import Http404
from django.utils import timezone

from jobs.models import EvidenceBundle, JobEvent, TrainingJob
from jobs.submission.task_queue import end_hold_soon


def release_hold(owner, job_id: int) -> bool:
    """End the owner's held job's hold now (its containers and nodes go within seconds); False when it is not
    theirs or not held. The end itself is the control queue's (or, with the broker away, the reaper's)."""
    return bool(end_holds_now(TrainingJob.objects.filter(pk=job_id, owner_id=getattr(owner, "pk", None)),
                              f"Released by {owner.get_username()}"))


def end_holds_now(jobs: QuerySet[TrainingJob], words: str) -> list[int]:
    """End the holds of those of `jobs` still held, saying `words` in each one's events; the ids ended. Their
    nodes are freed by the control queue, as at the hold's own end."""
    now = timezone.now()
    held = list(jobs.filter(held_until__gt=now).values_list("pk", flat=True))
    ended = [pk for pk in held if TrainingJob.objects.filter(pk=pk, held_until__gt=now).update(held_until=now)]
    for pk in ended:
        JobEvent.objects.create(job_id=pk, kind="debug-hold", message=words)
        end_hold_soon(pk)
    return ended


def owned_bundles(owner, job_id: int) -> QuerySet[EvidenceBundle]:
    """The evidence bundles of the owner's job, without their content (a list)."""
    return (EvidenceBundle.objects.filter(job_id=job_id, job__owner_id=getattr(owner, "pk", None))
            .defer("content").order_by("taken_at", "id"))


def owned_bundle(owner, job_id: int, bundle_id: int) -> EvidenceBundle:
    """One evidence bundle of the owner's job; Http404 for anyone else's, or none."""
    bundle = EvidenceBundle.objects.filter(pk=bundle_id, job_id=job_id, job__owner_id=getattr(owner, "pk", None)).first()
    if bundle is None:
        raise Http404("No such evidence.")
    return bundle


def bundle_filename(bundle: EvidenceBundle) -> str:
    return f"job-{bundle.job_id}-attempt-{bundle.attempt}-{bundle.reason}-evidence-{bundle.pk}.json"
