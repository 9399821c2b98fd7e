from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from jobs.api.docs import ApiDocs, ApiSchema

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/schema", ApiSchema.as_view(), name="api-schema"),
    path("api/v1/docs", ApiDocs.as_view(url_name="api-schema"), name="api-docs"),
    path("api/v1/", include("jobs.api.urls")),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("i18n/", include("django.conf.urls.i18n")),
    path("", include("jobs.urls")),
]

# Django's 500 page, but a 503 with Retry-After when the database was away outside a view (console.database_busy).
handler500 = "console.database_busy.server_error"
