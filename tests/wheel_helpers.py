"""What the wheel's unit tests and its model-based test share: an entry that counts
how often the wheel files it."""

from __future__ import annotations

from typing import Any

from aiowheel._wheel import Bucket, WheelEntry

# The slot descriptor of WheelEntry._bucket, to read and write the real slot.
_BUCKET_SLOT: Any = WheelEntry.__dict__["_bucket"]


class Entry(WheelEntry):
    """A wheel entry that counts how often the wheel files it.

    ``_bucket`` shadows the slot of ``WheelEntry`` with a property so that every
    assignment the wheel makes is seen: the first non-``None`` one is the insert,
    each later one is a move (a cascade, or a re-file of an early entry).
    """

    __slots__ = ("filings", "name")

    def __init__(self, name: object = None) -> None:
        super().__init__()
        self.name = name
        self.filings = 0

    def _get_bucket(self) -> Bucket | None:
        bucket: Bucket | None = _BUCKET_SLOT.__get__(self, WheelEntry)
        return bucket

    def _set_bucket(self, bucket: Bucket | None) -> None:
        if bucket is not None and not _resorted(self._get_bucket(), bucket):
            self.filings += 1
        _BUCKET_SLOT.__set__(self, bucket)

    # Shadows WheelEntry's `_bucket` slot: every assignment the wheel makes is seen.
    _bucket = property(_get_bucket, _set_bucket)

    @property
    def moves(self) -> int:
        return self.filings - 1

    def __repr__(self) -> str:
        return f"Entry({self.name!r}, deadline={self._deadline})"


def _resorted(old: Bucket | None, new: Bucket) -> bool:
    """The wheel re-links already-due entries into a sorted copy of the due bucket
    (level -1) to hand them back in deadline order: that is not a move between levels."""
    return old is not None and old.level == -1 and new.level == -1
