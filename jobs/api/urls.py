from django.urls import path

from jobs.api.log_events import job_log_events
from jobs.api.log_search import TrainingJobLogMatches
from jobs.api.shells import TrainingJobShellInput, TrainingJobShells, job_shell_output
from jobs.api.start_forecast import TrainingJobStartForecast

from . import compare, data, events, evidence, resources, results, views

urlpatterns = [
    path("specs", views.SpecList.as_view(), name="api-specs"),
    path("engines", views.EngineList.as_view(), name="api-engines"),
    path("code-dirs", views.CodeDirList.as_view(), name="api-code-dirs"),
    path("code-dirs/<id:pk>", views.CodeDirDetail.as_view(), name="api-code-dir"),
    # The user's own bucket in each object store: browse it, and links to put and get files.
    path("data", data.DataBrowse.as_view(), name="api-data"),
    path("data/upload-links", data.DataUploadLinks.as_view(), name="api-data-upload-links"),
    path("data/download-link", data.DataDownloadLink.as_view(), name="api-data-download-link"),
    path("training-jobs", views.TrainingJobList.as_view(), name="api-jobs"),
    path("training-jobs/compare", compare.JobComparison.as_view(), name="api-jobs-compare"),
    path("training-jobs/<id:pk>", views.TrainingJobDetail.as_view(), name="api-job"),
    path("training-jobs/<id:pk>/log", views.job_log, name="api-job-log"),
    path("training-jobs/<id:pk>/log/events", job_log_events, name="api-job-log-events"),
    path("training-jobs/<id:pk>/log/lines", views.TrainingJobLogLines.as_view(), name="api-job-log-lines"),
    path("training-jobs/<id:pk>/log/download", views.TrainingJobLogDownload.as_view(), name="api-job-log-download"),
    path("training-jobs/<id:pk>/log/matches", TrainingJobLogMatches.as_view(), name="api-job-log-matches"),
    path("training-jobs/<id:pk>/log/first-error", views.TrainingJobLogFirstError.as_view(), name="api-job-log-first-error"),
    path("training-jobs/<id:pk>/nccl", views.TrainingJobNccl.as_view(), name="api-job-nccl"),
    path("training-jobs/<id:pk>/events", events.TrainingJobEvents.as_view(), name="api-job-events"),
    path("training-jobs/<id:pk>/resources", resources.JobResources.as_view(), name="api-job-resources"),
    path("training-jobs/<id:pk>/stop", views.TrainingJobStop.as_view(), name="api-job-stop"),
    path("training-jobs/<id:pk>/start-forecast", TrainingJobStartForecast.as_view(), name="api-job-start-forecast"),
    # A terminal in a worker's container: open, type, read.
    path("training-jobs/<id:pk>/shells", TrainingJobShells.as_view(), name="api-job-shells"),
    path("training-jobs/<id:pk>/shells/<str:session_id>/input", TrainingJobShellInput.as_view(),
         name="api-job-shell-input"),
    path("training-jobs/<id:pk>/shells/<str:session_id>/output", job_shell_output, name="api-job-shell-output"),
    # What a run left: each rank's end and the failure card, metrics, outputs.
    path("training-jobs/<id:pk>/outcome", results.JobOutcome.as_view(), name="api-job-outcome"),
    path("training-jobs/<id:pk>/metrics", results.JobMetrics.as_view(), name="api-job-metrics"),
    path("training-jobs/<id:pk>/checkpoints", results.JobCheckpoints.as_view(), name="api-job-checkpoints"),
    path("training-jobs/<id:pk>/outputs", results.JobOutputs.as_view(), name="api-job-outputs"),
    path("training-jobs/<id:pk>/outputs.tar.gz", results.JobOutputsArchive.as_view(), name="api-job-outputs-archive"),
    # A failed or hung job's evidence, and the end of a failed job's hold for debugging (its owner's).
    path("training-jobs/<id:pk>/evidence/<id:bundle_id>", evidence.TrainingJobEvidence.as_view(),
         name="api-job-evidence"),
    path("training-jobs/<id:pk>/release-hold", evidence.TrainingJobReleaseHold.as_view(), name="api-job-release-hold"),
    path("training-jobs/<id:pk>/outputs/<path:path>", results.JobOutputDownload.as_view(), name="api-job-output-file"),
]
