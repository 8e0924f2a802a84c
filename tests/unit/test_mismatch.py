"""The mismatch ledger without MPI: the rows that ride along with the digest check."""
import random

import numpy as np
import pytest

from hpccoll.base import mismatch


def _fp(rng):
    fp = tuple(rng.randrange(1000) for _ in mismatch.FP_FIELDS)
    return mismatch.with_seq(fp, 0)


def _expected(led, count):
    """padded's definition: rows(count), oldest first, right-aligned in -1 rows."""
    out = np.full((count, len(mismatch.FP_FIELDS)), -1, np.int64)
    rows = led.rows(count)
    if rows:
        out[count - len(rows):] = rows
    return out


@pytest.mark.parametrize("window", [64, 128])
def test_padded_rows_at_every_fill_and_ring_position(window):
    rng = random.Random(window)
    led = mismatch.Ledger(64, window)
    for seq in range(3 * window + 5):
        for count in (1, 7, 64, window):
            np.testing.assert_array_equal(led.padded(count), _expected(led, count))
        led.record(seq, _fp(rng), rng.randrange(1 << 30))


def test_rows_taken_for_later_are_those_of_their_call():
    """The digest check takes its rows at issue and makes the array only if digests
    differ: collectives recorded meanwhile (the ring overwritten) do not change them."""
    rng = random.Random(1)
    led = mismatch.Ledger(64, 64)
    for seq in range(100):
        led.record(seq, _fp(rng), seq)
    now = led.padded(64)
    later = led.padded_later(64)
    for seq in range(100, 300):
        led.record(seq, _fp(rng), seq)
    np.testing.assert_array_equal(later(), now)
    assert list(now[:, mismatch.SEQ]) == list(range(36, 100))


def test_record_says_when_the_digest_check_is_due():
    led = mismatch.Ledger(4, 64)
    due = [led.record(seq, (0,) * len(mismatch.FP_FIELDS), 5) is not None for seq in range(12)]
    assert due == [seq % 4 == 3 for seq in range(12)]
    assert led.record(12, (0,) * len(mismatch.FP_FIELDS), 5) is None
    assert led.digest == led.digest_at(12)
