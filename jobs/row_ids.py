"""A row's number as a user types it (a pool, a spec, a group given by id)."""


def row_id(text: str) -> int | None:
    """`text` as a database row's number, or None: ASCII digits only (str.isdigit also takes '²', which int()
    refuses) and no more of them than a 64-bit column holds (a longer one overflows SQLite's integer)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None
