"""The schema and its Swagger UI, both public: they describe the API and hold nothing of anyone's."""

from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.permissions import AllowAny

# Swagger UI sets style attributes as it renders; its script still comes only from this origin.
DOCS_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
               "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'")


class ApiSchema(SpectacularAPIView):
    permission_classes = [AllowAny]
    authentication_classes: list = []


class ApiDocs(SpectacularSwaggerSplitView):
    permission_classes = [AllowAny]
    authentication_classes: list = []

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        response["Content-Security-Policy"] = DOCS_POLICY
        return response
