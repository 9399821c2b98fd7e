"""A job's events, as the reference's events tab lists them: created and queued, each worker's pre-check and
code download, started, a worker lost, taken up again, outputs collected, stopped (by whom), restarted,
finished."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.models import JobEvent
from jobs.submission.access import visible_jobs


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "kind", "message"]
        extra_kwargs = {
            "at": {"help_text": "When it happened."},
            "kind": {"help_text": "state:<State> for a change of state; code, pre-check, worker-lost, resumed, "
                                  "outputs, stop, watchdog, restarted for the others."},
            "message": {"help_text": "What happened, in words."},
        }


class TrainingJobEvents(APIView):
    @extend_schema(summary="A job's events, oldest first", responses={200: JobEventSerializer(many=True)})
    def get(self, request, pk):
        job = get_object_or_404(visible_jobs(request.user), pk=pk)
        return Response(JobEventSerializer(job.events.order_by("at", "id"), many=True).data)
