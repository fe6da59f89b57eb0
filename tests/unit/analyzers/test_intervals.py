"""Unions of intervals, the one implementation locks, ITL phases and GPU windows share."""

from inferprobe.analyzers.intervals import merged, union_length


def test_union_length_merges_overlaps():
    assert union_length([(0, 10), (5, 15), (20, 30)]) == 25
    assert union_length([]) == 0


def test_merged_joins_overlapping_and_touching_intervals_in_order():
    assert merged([(20, 30), (0, 10), (5, 15), (30, 31), (40, 41)]) == [(0, 15), (20, 31), (40, 41)]
    assert merged([(0, 10), (2, 3)]) == [(0, 10)]
