"""Who may see and act on which job: owners their own, staff everyone's."""

from .models import TrainingJob


def visible_jobs(user):
    jobs = TrainingJob.objects.select_related("owner", "spec", "engine_version__engine", "code_dir")
    if user.is_staff:
        return jobs
    return jobs.filter(owner=user)
