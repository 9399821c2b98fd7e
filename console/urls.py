from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path
from django.utils.translation import gettext_lazy as _
from django.views.generic import RedirectView

from jobs.api.docs import ApiDocs, ApiSchema

# The admin speaks of the console, not of Django.
admin.site.site_header = _("Training Console administration")
admin.site.site_title = _("Training Console")
admin.site.index_title = _("Administration")


class FaviconRedirect(RedirectView):
    """/favicon.ico, which browsers and tools ask for whatever the page says: the console's icon."""

    permanent = True

    def get_redirect_url(self, *args, **kwargs) -> str:
        # Resolved per request: the static files' names (hashed once collected) are not known at import.
        return static("favicon.svg")


urlpatterns = [
    path("favicon.ico", FaviconRedirect.as_view(), name="favicon"),
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
