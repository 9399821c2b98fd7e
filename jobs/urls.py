from django.urls import path

from jobs.pages import compare_page as compare_views
from jobs.pages import evidence as evidence_views
from jobs.pages import store_keys as store_key_views
from jobs.pages import tokens as token_views
from jobs.pages import views
from jobs.pages import webhooks as webhook_views

urlpatterns = [
    path("", views.job_list, name="job-list"),
    path("jobs/new", views.job_create, name="job-create"),
    path("jobs/bulk", views.job_bulk, name="job-bulk"),
    path("jobs/preview", views.job_preview, name="job-preview"),
    path("jobs/name-taken", views.job_name_taken, name="job-name-taken"),
    path("jobs/compare", compare_views.job_compare, name="job-compare"),
    path("jobs/<id:pk>", views.job_detail, name="job-detail"),
    path("jobs/<id:pk>/live", views.job_live, name="job-live"),
    path("jobs/<id:pk>/log.txt", views.job_log_download, name="job-log-download"),
    path("jobs/<id:pk>/rebuild", views.job_rebuild, name="job-rebuild"),
    path("jobs/<id:pk>/stop", views.job_stop, name="job-stop"),
    path("jobs/<id:pk>/delete", views.job_delete, name="job-delete"),
    path("jobs/<id:pk>/evidence/<id:bundle_id>.json", evidence_views.job_evidence, name="job-evidence"),
    path("jobs/<id:pk>/release-hold", evidence_views.job_release_hold, name="job-release-hold"),
    path("capacity", views.capacity, name="capacity"),
    path("tokens", token_views.token_list, name="token-list"),
    path("tokens/<id:pk>/revoke", token_views.token_revoke, name="token-revoke"),
    path("store-keys", store_key_views.store_keys_page, name="store-keys"),
    path("store-keys/<id:storage_id>", store_key_views.store_keys_set, name="store-keys-set"),
    path("store-keys/<id:storage_id>/remove", store_key_views.store_keys_remove, name="store-keys-remove"),
    path("webhook", webhook_views.webhook_page, name="webhook"),
    path("webhook/<str:action>", webhook_views.webhook_action, name="webhook-action"),
]
