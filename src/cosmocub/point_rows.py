"""The contended mark on a study point's row in points.tsv, and the filter every reader of those
tables applies (the studies' efficiencies and fits, the performance model's validation).

It sits in the lowest layer because studies/ and perfmodel/ both read it and may not import each
other; neither is training (train/epoch_conditions.py measures the conditions the mark is set from).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

CONTENDED_COLUMN = "contended"


def is_marked(row: Mapping[str, object]) -> bool:
    """A points.tsv row (as gathered, or read back as strings) marked contended."""
    return row.get(CONTENDED_COLUMN) in (True, "True")


def kept(rows: Sequence[Mapping[str, object]]) -> list:
    """The rows not marked contended (the same objects, in order)."""
    return [r for r in rows if not is_marked(r)]
