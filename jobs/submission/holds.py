"""A failed job held for debugging, seen from its owner: "release now" ends the hold at once, and the job's
evidence bundles are theirs alone (anyone else, staff included, is told there is no such job)."""

from django.db.models import QuerySet
from django.http import Http404
from django.utils import timezone

from jobs.models import EvidenceBundle, TrainingJob
from jobs.submission.task_queue import end_hold_soon


def release_hold(owner, job_id: int) -> bool:
    """End the owner's held job's hold now (its containers and nodes go within seconds); False when it is not
    theirs or not held. The end itself is the control queue's (or, with the broker away, the reaper's)."""
    released = TrainingJob.objects.filter(pk=job_id, owner_id=getattr(owner, "pk", None),
                                          held_until__gt=timezone.now()).update(held_until=timezone.now())
    if released:
        end_hold_soon(job_id)
    return bool(released)


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
