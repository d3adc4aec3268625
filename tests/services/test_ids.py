"""Random ids: base62 of the requested length, every digit reachable, no bias toward the
low digits (one random read per id, rejection sampling)."""
from __future__ import annotations

from collections import Counter
from unittest import mock

from app import ids


def test_random_b62_length_alphabet_and_coverage():
    text = "".join(ids.random_b62(20) for _ in range(500))  # 10,000 characters
    assert len(ids.random_b62(20)) == 20 and len(ids.random_b62(1)) == 1
    counts = Counter(text)
    assert set(counts) == set(ids.ALPHABET)
    # bias check: 248-255 would fold onto "0"-"7" if not rejected; expect ~161 each
    low, high = sum(counts[c] for c in "01234567") / 8, sum(counts[c] for c in "uvwxyz") / 6
    assert low < 1.15 * high  # unbiased: ~1.0; without the rejection: ~1.25


def test_bytes_at_or_above_248_are_rejected():
    reads = iter([bytes([255, 248, 0, 61, 62]) + bytes(7), bytes([1] * 12)])
    with mock.patch.object(ids.secrets, "token_bytes", side_effect=lambda n: next(reads)):
        assert ids.random_b62(4) == "0z00"
