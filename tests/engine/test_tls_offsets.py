"""``CipherOffsets``: plaintext acknowledged from ciphertext acknowledged; the records a
write is cut into (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weir.common._tls import MAX_PAIRS, RECORD_PLAINTEXT, CipherOffsets, record_plaintexts


def test_plaintext_counts_only_once_its_whole_record_is_acknowledged() -> None:
    offsets = CipherOffsets()
    # A handshake of 500 ciphertext bytes, then records of 100, 200 and 50 plaintext
    # bytes (each 29 bytes of overhead).
    offsets.wrote(100, 500 + 129)
    offsets.wrote(300, 629 + 229)
    offsets.wrote(350, 858 + 79)
    assert offsets.written == 350
    assert offsets.acknowledged(0) == 0
    assert offsets.acknowledged(628) == 0  # one byte of the first record missing
    assert offsets.acknowledged(629) == 100
    assert offsets.unacknowledged(857) == 250
    assert offsets.acknowledged(937) == 350
    assert offsets.unacknowledged(937) == 0


def test_what_was_acknowledged_never_goes_back() -> None:
    offsets = CipherOffsets()
    offsets.wrote(10, 40)
    assert offsets.acknowledged(40) == 10
    assert offsets.acknowledged(0) == 10  # a stale reading changes nothing


def test_pairs_are_forgotten_once_acknowledged_and_bounded_meanwhile() -> None:
    offsets = CipherOffsets()
    for i in range(1, MAX_PAIRS + 11):
        offsets.wrote(i * 10, i * 40)
    assert len(offsets._pairs) == MAX_PAIRS
    # The merged pairs count later, never earlier: the newest survives intact ...
    last = (MAX_PAIRS + 10) * 10
    assert offsets.acknowledged((MAX_PAIRS + 10) * 40) == last
    assert not offsets._pairs
    # ... and a pair that was merged away is counted only with the one after it.
    merged = CipherOffsets()
    for i in range(1, MAX_PAIRS + 2):
        merged.wrote(i * 10, i * 40)
    assert merged.acknowledged(MAX_PAIRS * 40) == (MAX_PAIRS - 1) * 10


def test_offsets_must_only_grow() -> None:
    offsets = CipherOffsets()
    offsets.wrote(10, 40)
    with pytest.raises(ValueError):
        offsets.wrote(5, 50)
    with pytest.raises(ValueError):
        offsets.wrote(20, 30)


@given(st.lists(st.integers(min_value=0, max_value=3 * RECORD_PLAINTEXT + 7), max_size=12))
def test_records_cut_from_pieces_are_their_bytes_in_order_each_at_most_one_record(
    sizes: list[int],
) -> None:
    pieces = [bytes([65 + i % 26]) * size for i, size in enumerate(sizes)]
    records = list(record_plaintexts(pieces))
    assert b"".join(records) == b"".join(pieces)
    assert all(0 < len(r) <= RECORD_PLAINTEXT for r in records)
    # Only the last record may be short: small pieces share records, none is split
    # into more records than its bytes need.
    assert all(len(r) == RECORD_PLAINTEXT for r in records[:-1])


def test_a_large_piece_is_cut_into_views_of_itself_not_copied() -> None:
    frame = b"x" * (4 * RECORD_PLAINTEXT)
    records = list(record_plaintexts([frame]))
    assert len(records) == 4
    assert all(isinstance(r, memoryview) and r.obj is frame for r in records)
