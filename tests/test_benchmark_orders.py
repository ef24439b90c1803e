"""The run orders the interleaved benchmarks use (benchmarks/orders.py): every side as often in
every place, and straight after every other side as often."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest

from benchmarks import orders


@pytest.mark.parametrize("n", range(1, 8))
def test_each_side_in_each_place_and_after_each_other_side_equally(n: int) -> None:
    items = [f"side{k}" for k in range(n)]
    rows = orders.balanced_orders(items)
    assert len(rows) == (1 if n == 1 else n if n % 2 == 0 else 2 * n)
    assert all(sorted(row) == sorted(items) for row in rows)
    places = Counter((place, side) for row in rows for place, side in enumerate(row))
    assert set(places.values()) == {len(rows) // n}
    assert len(places) == n * n
    if n > 1:
        pairs = Counter((a, b) for row in rows for a, b in pairwise(row))
        assert len(pairs) == n * (n - 1)  # every ordered pair of two sides
        assert len(set(pairs.values())) == 1  # as often as every other


def test_a_rotated_order_is_not_balanced() -> None:
    """What the benchmarks did before: rotations keep who runs after whom."""
    items = ["bytes", "two", "gz", "sdk"]
    rotated = [items[k:] + items[:k] for k in range(4)]
    pairs = Counter((a, b) for row in rotated for a, b in pairwise(row))
    assert pairs[("sdk", "bytes")] == 3 and pairs[("bytes", "sdk")] == 0
    balanced = Counter((a, b) for row in orders.balanced_orders(items) for a, b in pairwise(row))
    assert balanced[("sdk", "bytes")] == balanced[("bytes", "sdk")] == 1
