"""Run orders for interleaved benchmarks: each side equally often in each place and straight
after each other side, so what one side leaves behind (a long pure-Python run lets the machine
take back freed memory, and the next side faults it in again) is charged to every side alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def balanced_orders(items: Sequence[T]) -> list[list[T]]:
    """A Williams design over ``items``: rows of all of them in which each item stands in each
    place equally often and each ordered pair (a straight before b) occurs equally often, once
    per row set (n rows for an even count of items, 2n for an odd one). Round r of a benchmark
    runs row r % len(rows).

    Rotating one order (abcd, bcda, ...) moves each side to each place but keeps who runs after
    whom: b always after a, except across rounds."""
    n = len(items)
    if n < 2:
        return [list(items)]
    first, low, high = [0], 1, n - 1  # 0, 1, n-1, 2, n-2, ...
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(x + shift) % n for x in first] for shift in range(n)]
    if n % 2:  # an odd count needs the mirrored rows too
        rows += [row[::-1] for row in rows]
    return [[items[x] for x in row] for row in rows]
