"""A job's evidence bundles (what was seen inside it when it failed or its watchdog fired), its owner's alone,
and "release now" for a failed job held for debugging."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.submission.holds import owned_bundle, release_hold


@extend_schema(summary="One evidence bundle of the user's job: its ranks' last lines and stacks, the masked "
                       "environment, the command, the node facts",
               parameters=[OpenApiParameter("bundle_id", int, OpenApiParameter.PATH,
                                            description="The bundle's id (the job's `evidence` lists them).")],
               responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description=(
                   "The bundle's content: reason, attempt, status, status_message, command, environment (masked), "
                   "last_lines (per rank), stacks (per worker, per live rank: py-spy's dump or why none), nodes."))})
class TrainingJobEvidence(APIView):
    def get(self, request, pk: int, bundle_id: int):
        return Response(owned_bundle(request.user, pk, bundle_id).content)


@extend_schema(summary="End the hold of the user's failed job now: its containers are ended and its nodes freed",
               request=None, responses={202: None})
class TrainingJobReleaseHold(APIView):
    def post(self, request, pk: int):
        if not release_hold(request.user, pk):
            return Response({"detail": "No job of yours with that id is held for debugging."},
                            status=status.HTTP_404_NOT_FOUND)
        return Response(status=status.HTTP_202_ACCEPTED)
