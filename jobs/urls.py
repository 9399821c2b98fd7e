from django.urls import path

from . import views

urlpatterns = [
    path("", views.job_list, name="job-list"),
    path("jobs/new", views.job_create, name="job-create"),
    path("jobs/<int:pk>", views.job_detail, name="job-detail"),
]
