"""The console's own pools: its allocator gives queued jobs free nodes (jobs.allocation); a run's end frees them
in the transaction that records it, so there is nothing to watch or give back here."""

from jobs import allocation


class ConsoleNodes:
    def dispatch(self) -> list[int]:
        return allocation.dispatch_pending()

    def watch(self) -> list[int]:
        return []

    def release(self) -> None:
        return None


CONSOLE_NODES = ConsoleNodes()
