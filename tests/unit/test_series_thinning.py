"""A chart's series thinned as it is read (jobs.results.metrics.Thinning): the same points as the whole-list rule
that the charts were drawn with, for every length and limit, holding only what it keeps."""

from hypothesis import given
from hypothesis import strategies as st

from jobs.results.metrics import Thinning, downsample


def thinned_whole(points: list, limit: int) -> list:
    """The rule as it reads on a whole list: the ends, then each bucket's first lowest and first highest point
    (a limit under 4 leaves no bucket between the ends: it counts as 4)."""
    limit = max(limit, 4)
    if len(points) <= limit:
        return list(points)
    buckets = (limit - 2) // 2
    inner = len(points) - 2
    kept = [points[0]]
    for bucket in range(buckets):
        start, end = 1 + bucket * inner // buckets, 1 + (bucket + 1) * inner // buckets
        if start < end:
            low = min(range(start, end), key=lambda index: points[index][1])
            high = max(range(start, end), key=lambda index: points[index][1])
            kept.extend(points[index] for index in sorted({low, high}))
    kept.append(points[-1])
    return kept


@given(st.lists(st.integers(min_value=-3, max_value=3), max_size=400), st.integers(min_value=0, max_value=80))
def test_a_series_read_once_keeps_the_points_the_whole_list_rule_keeps(values, limit):
    points = [[step, float(value)] for step, value in enumerate(values)]
    thinning = Thinning(len(points), limit)
    for point in points:
        thinning.add(point)
    assert thinning.finish() == thinned_whole(points, limit) == downsample(points, limit)


def test_a_spike_and_the_last_value_survive_a_long_series():
    points = [[step, 1.0] for step in range(100_000)]
    points[54_321][1] = 99.0
    points[-1][1] = 0.5
    thinning = Thinning(len(points), 200)
    for point in points:
        thinning.add(point)
    assert len(thinning.kept) <= 200
    assert [54_321, 99.0] in thinning.kept and thinning.kept[-1] == [99_999, 0.5] and thinning.kept[0] == [0, 1.0]


def test_a_series_shorter_or_longer_than_its_count_still_keeps_its_ends():
    points = [[step, float(step % 7)] for step in range(50)]
    points[-1][1] = 3.5  # neither its bucket's lowest nor its highest
    short = Thinning(60, 10)  # counted 60, read 50 (points committed after the count below the last id)
    for point in points:
        short.add(point)
    kept = short.finish()
    assert kept[0] == points[0] and kept[-1] == points[-1] and len(kept) <= 12
    extra = Thinning(0, 10)  # a series first seen after the count
    for point in points[:3]:
        extra.add(point)
    assert extra.finish() == points[:3]
