from django.urls import path

from . import views

urlpatterns = [
    path("specs", views.SpecList.as_view(), name="api-specs"),
    path("engines", views.EngineList.as_view(), name="api-engines"),
    path("code-dirs", views.CodeDirList.as_view(), name="api-code-dirs"),
    path("training-jobs", views.TrainingJobList.as_view(), name="api-jobs"),
    path("training-jobs/<int:pk>", views.TrainingJobDetail.as_view(), name="api-job"),
    path("training-jobs/<int:pk>/log", views.TrainingJobLog.as_view(), name="api-job-log"),
    path("training-jobs/<int:pk>/log/lines", views.TrainingJobLogLines.as_view(), name="api-job-log-lines"),
    path("training-jobs/<int:pk>/stop", views.TrainingJobStop.as_view(), name="api-job-stop"),
]
