"""How many lines of a job's log match its filters: the count beside the job page's log search."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.logs.forms import LogQueryForm
from jobs.logs.search import count_matches
from jobs.submission.access import visible_jobs
from jobs.submission.forms import form_errors

from .schema import AFTER, LOG_FILTERS


class MatchCountSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="Matching lines numbered above `after`, up to `through` or to `next`.")
    next = serializers.IntegerField(allow_null=True, help_text=(
        "Counted up to this line only (a pattern or a level is checked line by line, a second at a time): ask "
        "again with it as `after` and the same `through`, and add the counts. Null: the count is complete."))
    through = serializers.IntegerField(help_text="The last line counted: the log's length when counting began.")


class TrainingJobLogMatches(APIView):
    """The number of lines that match the filters, in the whole log or the stretch `after`..`through`."""

    @extend_schema(summary="How many lines of a job's log match its filters", responses=MatchCountSerializer,
                   parameters=[AFTER, *LOG_FILTERS, OpenApiParameter(
                       "through", int, description="Count up to this line (default: the log's last line now).")])
    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        form = LogQueryForm(request.query_params)
        if not form.is_valid():
            return Response(form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        through_text = request.query_params.get("through", "")
        if through_text and not (through_text.isascii() and through_text.isdigit() and len(through_text) <= 18):
            return Response({"through": ["Must be a whole number."]}, status=status.HTTP_400_BAD_REQUEST)
        through = min(int(through_text), job.log_line_count) if through_text else job.log_line_count
        query = form.cleaned_data
        answer = count_matches(job.pk, query, after=query["after"] or 0, through=through)
        return Response({"count": answer.count, "next": answer.next, "through": answer.through})
