"""The schema and its Swagger UI, both public: they describe the API and hold nothing of anyone's."""

from django.conf import settings
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.permissions import AllowAny


def docs_policy() -> str:
    """The console's policy, with style attributes allowed: Swagger UI sets them as it renders. Its scripts
    still come only from this origin (the split view serves its start-up script as a file)."""
    policy = settings.CONTENT_SECURITY_POLICY
    return policy.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'", 1) if policy else policy


class ApiSchema(SpectacularAPIView):
    permission_classes = [AllowAny]
    authentication_classes: list = []


class ApiDocs(SpectacularSwaggerSplitView):
    permission_classes = [AllowAny]
    authentication_classes: list = []

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        policy = docs_policy()
        if policy:
            response["Content-Security-Policy"] = policy
        return response
