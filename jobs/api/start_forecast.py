"""A waiting job's start forecast: its place, why it waits, when it may start, what would start it sooner."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.pages.waiting_forecast import job_forecast
from jobs.submission.access import visible_jobs


class StartAlternativeSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["fewer_nodes", "other_pool", "shorter_auto_stop"],
                                   help_text="What changes: the node count, the pool, or the auto stop.")
    words = serializers.CharField(help_text="The alternative in words.")
    node_count = serializers.IntegerField(help_text="The node count to submit with.")
    pool = serializers.CharField(allow_null=True, help_text="The pool to submit to (null: no pool).")
    auto_stop_hours = serializers.IntegerField(allow_null=True, help_text="The auto stop to submit with (null: none).")


class StartForecastSerializer(serializers.Serializer):
    waiting = serializers.BooleanField(help_text="Whether the job waits; false: every other field is null or empty.")
    scheduler = serializers.ChoiceField(choices=["console", "slurm"], allow_null=True,
                                        help_text="Who starts it: the console's allocator, or Slurm (which gives no "
                                                  "estimate here: `reason` is what Slurm says).")
    position = serializers.IntegerField(allow_null=True, help_text="Its place in its queue, 1: served next.")
    ahead = serializers.IntegerField(allow_null=True, help_text="How many jobs of its queue go before it.")
    reason = serializers.CharField(help_text="Why it waits, in words.")
    estimate = serializers.CharField(help_text="When it may start, in words: now, a range, unknown or never.")
    starts_now = serializers.BooleanField(help_text="It starts at the next dispatch.")
    never = serializers.BooleanField(help_text="Its pool has fewer enabled nodes of its spec than it needs.")
    earliest = serializers.DateTimeField(allow_null=True, help_text="The earliest start, if the jobs ahead of it end "
                                                                    "at once; null: unknown.")
    latest = serializers.DateTimeField(allow_null=True, help_text="The latest start, if every job runs to its auto "
                                                                  "stop; null: unknown.")
    alternatives = StartAlternativeSerializer(many=True, help_text="Changes with which it would start at the next "
                                                                   "dispatch, each checked by a dry run of the allocator.")


class TrainingJobStartForecast(APIView):
    @extend_schema(summary="When a waiting job may start, and what would start it sooner",
                   responses=StartForecastSerializer)
    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user).select_related("pool"), pk=pk)
        forecast = job_forecast(job)
        if forecast is None:
            return Response({"waiting": False, "scheduler": None, "position": None, "ahead": None, "reason": "",
                             "estimate": "", "starts_now": False, "never": False, "earliest": None, "latest": None,
                             "alternatives": []})
        return Response({"waiting": True, **forecast})
