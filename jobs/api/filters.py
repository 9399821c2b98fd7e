"""What the job list can be narrowed and ordered by (django-filter), always within the jobs the user may see."""

import django_filters  # type: ignore[import-untyped]  # django-filter ships no type information
from rest_framework.filters import OrderingFilter

from jobs.models import JobStatus, TrainingJob
from jobs.pages.job_list import family_ids


class JobFilter(django_filters.FilterSet):
    # Not DISTINCT (the filter's default, for a many-valued relation): it made the database sort every
    # matching row with its joins, 50 ms with 100,000 jobs.
    status = django_filters.MultipleChoiceFilter(
        choices=JobStatus.choices, distinct=False, help_text="Only jobs in this state; repeat it for several states.")
    owner = django_filters.CharFilter(field_name="owner__username", help_text="Only this user's jobs (a username).")
    spec = django_filters.CharFilter(field_name="spec__name", help_text="Only jobs of this spec (its name).")
    pool = django_filters.CharFilter(field_name="pool__name", help_text="Only jobs of this resource pool (its name).")
    engine = django_filters.CharFilter(field_name="engine_version__engine__name",
                                       help_text="Only jobs of this engine (its name).")
    created_after = django_filters.IsoDateTimeFilter(
        field_name="created_at", lookup_expr="gte", help_text="Only jobs created at or after this time (ISO 8601).")
    created_before = django_filters.IsoDateTimeFilter(
        field_name="created_at", lookup_expr="lt", help_text="Only jobs created before this time (ISO 8601).")
    name = django_filters.CharFilter(field_name="name", lookup_expr="icontains",
                                     help_text="Only jobs whose name holds this text (any case).")
    family = django_filters.NumberFilter(method="in_family", min_value=1, help_text=(
        "Only this job's family: the job its chain of Rebuilds started from, and every Rebuild of it."))

    def in_family(self, queryset, name, value):
        return queryset.filter(pk__in=family_ids(int(value)))

    class Meta:
        model = TrainingJob
        fields: list[str] = []


class JobOrdering(OrderingFilter):
    ordering_fields = ["created_at", "started_at", "ended_at", "name", "status", "id"]
    # The list is newest first unless told otherwise; the id breaks ties between jobs created together.
    ordering = ["-created_at", "-id"]
    ordering_description = "Order by created_at, started_at, ended_at, name, status or id; a leading - reverses it."

    def filter_queryset(self, request, queryset, view):
        ordering = self.get_ordering(request, queryset, view)
        if ordering:
            if ordering[-1].lstrip("-") != "id":
                ordering = [*ordering, "-id" if ordering[-1].startswith("-") else "id"]
            return queryset.order_by(*ordering)
        return queryset
