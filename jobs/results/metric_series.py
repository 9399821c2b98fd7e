"""A job's metric series read for a chart: each (name, rank) series thinned as it is read, in id order.

The charts (jobs.api.results) and the run comparison (jobs.pages.comparison) both draw them; a long run has
millions of points, so none is held whole: each series is counted first, then thinned point by point
(jobs.results.metrics.Thinning), both reads stopping at the same last point.
"""

from collections.abc import Callable
from typing import Any

from django.db.models import Count, Max, QuerySet

from jobs.results.metrics import Thinning

SeriesKey = tuple[str, int | None]


def thinned_series(points: QuerySet, columns: tuple[str, ...], limit: int, make: Callable[[tuple], Any],
                   value: Callable[[Any], float]) -> dict[SeriesKey, tuple[list, int]]:
    """Each series of `points` (MetricPoint rows), in the order the series first appear: (the points kept, made by
    `make` from a row of name, rank and `columns`; how many points it had). A point committed between the count
    and the read below the last id (two monitors overlapping after a takeover) only makes its series a point
    longer or shorter than counted."""
    points = points.filter(id__lte=points.aggregate(last=Max("id"))["last"] or 0)
    lengths = {(name, rank): count for name, rank, count in
               points.order_by().values_list("name", "rank").annotate(count=Count("id"))}
    series: dict[SeriesKey, Thinning] = {}
    for row in points.order_by("id").values_list("name", "rank", *columns).iterator(chunk_size=20000):
        key = (row[0], row[1])
        thinning = series.get(key) or series.setdefault(key, Thinning(lengths.get(key, 0), limit, value))
        thinning.add(make(row))
    return {key: (thinning.finish(), thinning.seen) for key, thinning in series.items()}
