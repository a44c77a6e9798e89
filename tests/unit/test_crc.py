"""crc32c_combine: the checksum of a concatenation from its parts' checksums, for every length shape."""

import random

import pytest
from crc32c import crc32c

from workers.crc import crc32c_combine


@pytest.mark.parametrize("len_a,len_b", [(0, 0), (0, 9), (9, 0), (1, 1), (3, 4096), (1000, 123457), (7, 1 << 20)])
def test_combine_equals_the_checksum_of_the_concatenation(len_a, len_b):
    rng = random.Random(len_a * 31 + len_b)
    a, b = rng.randbytes(len_a), rng.randbytes(len_b)
    assert crc32c_combine(crc32c(a), crc32c(b), len_b) == crc32c(a + b)


def test_combine_folds_many_parts_in_order_and_order_matters():
    rng = random.Random(5)
    parts = [rng.randbytes(rng.randrange(1, 5000)) for _ in range(40)]
    crc = 0
    for p in parts:
        crc = crc32c_combine(crc, crc32c(p), len(p))
    assert crc == crc32c(b"".join(parts))
    swapped = crc32c_combine(crc32c_combine(0, crc32c(parts[1]), len(parts[1])), crc32c(parts[0]), len(parts[0]))
    assert swapped != crc32c(parts[0] + parts[1])
