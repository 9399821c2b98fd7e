"""The comparison of 2-10 runs as JSON: what the compare page and `tc compare` show (jobs.pages.comparison)."""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.pages.comparison import UnseenJobsError, comparison
from jobs.pages.run_diff import CompareIdsError, compare_ids


class ComparedRunSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="The job's id.")
    name = serializers.CharField(help_text="Its name.")
    status = serializers.CharField(help_text="Its state.")
    owner = serializers.CharField(help_text="Who submitted it.")
    rebuilt_from = serializers.IntegerField(allow_null=True, help_text="The job it is a Rebuild of; null for none.")
    duration_seconds = serializers.FloatField(allow_null=True, help_text="How long it ran; null if it never started.")


class DifferingRowSerializer(serializers.Serializer):
    section = serializers.CharField(help_text="parameters, environment, engine, resources, code, command, "
                                              "placement (the node of each worker) or nccl (its transports).")
    key = serializers.CharField(help_text="The setting's name.")
    values = serializers.ListField(child=serializers.CharField(allow_null=True, allow_blank=True), help_text=(
        "One per job, in the order asked; null where a job has no such setting; secrets masked."))


class SideBySideRowSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="A final metric's name, or duration_seconds.")
    values = serializers.ListField(child=serializers.FloatField(allow_null=True),
                                   help_text="One per job, in the order asked; null where a job has none.")


class ComparedSeriesSerializer(serializers.Serializer):
    job = serializers.IntegerField(help_text="The job's id.")
    metric = serializers.CharField(help_text="The metric's name.")
    rank = serializers.IntegerField(allow_null=True, help_text="The rank; null for a line without one.")
    points = serializers.ListField(child=serializers.ListField(child=serializers.FloatField(allow_null=True)),
                                   help_text="[step (null when the line has none), value] pairs, in the order read, "
                                             "downsampled to about 2000.")


class ComparisonSerializer(serializers.Serializer):
    runs = ComparedRunSerializer(many=True, help_text="The jobs, in the order asked.")
    differences = DifferingRowSerializer(many=True, help_text="Only the settings whose values differ.")
    finals = SideBySideRowSerializer(many=True, help_text="Each final metric, then the duration, side by side.")
    series = ComparedSeriesSerializer(many=True, help_text="The metric lines of every job, for overlaid charts.")


class JobComparison(APIView):
    """2 to 10 jobs the user may see, compared: what differs, final metrics and durations, metric series."""

    @extend_schema(summary="Compare 2 to 10 jobs", responses=ComparisonSerializer, parameters=[
        OpenApiParameter("ids", str, required=True, description="The jobs' ids, separated by commas: 3,5,8."),
        OpenApiParameter("rank", str, enum=["0", "all"],
                         description="The metric series of rank 0 (the default) or of every rank.")])
    def get(self, request):
        rank = request.query_params.get("rank", "0")
        if rank not in ("0", "all"):
            return Response({"rank": ["0 or all."]}, status=status.HTTP_400_BAD_REQUEST)
        try:
            ids = compare_ids(request.query_params.getlist("ids"))
        except CompareIdsError as error:
            return Response({"ids": [str(error)]}, status=status.HTTP_400_BAD_REQUEST)
        try:
            answer = comparison(request.user, ids, every_rank=rank == "all")
        except UnseenJobsError as error:
            return Response({"ids": [str(error)]}, status=status.HTTP_404_NOT_FOUND)
        return Response(answer)
