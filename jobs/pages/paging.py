"""Deep pages of a long list without building every row before them.

A page read with OFFSET makes the database build, join and throw away every row before it: with 100,000
jobs, page 4,000 of the list took 170 ms against 18 ms for page 1. `IdsFirst` walks the offset over the
ids alone, in the list's order (an index-only scan of `job_list_order` for the default one), and then
reads only the page's rows with their joins. Django's Paginator and DRF's LimitOffsetPagination both
take it in place of the queryset: they need `count()`, slicing and `ordered`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar, overload

from django.db.models import Model, QuerySet

Row = TypeVar("Row", bound=Model)


class IdsFirst(Generic[Row]):
    def __init__(self, queryset: QuerySet[Row]) -> None:
        self.queryset = queryset

    @property
    def ordered(self) -> bool:
        return self.queryset.ordered

    def count(self) -> int:
        return self.queryset.count()

    def __len__(self) -> int:
        return self.count()

    def __iter__(self) -> Iterator[Row]:
        return iter(self.queryset)

    @overload
    def __getitem__(self, window: int) -> Row: ...

    @overload
    def __getitem__(self, window: slice) -> list[Row]: ...

    def __getitem__(self, window: int | slice) -> Row | list[Row]:
        if isinstance(window, int):
            return self[window:window + 1][0]
        ids = list(self.queryset.values_list("pk", flat=True)[window])
        rows = self.queryset.in_bulk(ids)
        # A row deleted between the two reads is left out rather than failing the page.
        return [rows[pk] for pk in ids if pk in rows]
