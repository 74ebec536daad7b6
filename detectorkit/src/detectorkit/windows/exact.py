"""Exact sums of floats as array operations: what a window rule's arrays (`vectorised`) sum.

Each value is an integer times a power of two shared by the column (2^base), and that integer is
held as limbs of 31 bits, one int64 array per limb: running sums and their differences are then
NumPy's, exact while a column has fewer than 2^31 values. A sum back to a float is rounded once,
to nearest with ties to even, which is what the engine's sums give (math.fsum, Shewchuk's
partials): the limbs' top 62 bits, with a sticky bit for any below, go through one int64 ->
float64 conversion, and the power of two after it is exact. Python's own integers would do the
same a value at a time.
"""

from __future__ import annotations

import math

import numpy as np

BITS = 31
_MASK = (1 << BITS) - 1


class Exact:
    """A column of values as limbs (limbs[k] holds bits 31k to 31k+30 of each value's integer,
    with the value's sign), and the column's power of two."""

    def __init__(self, limbs: np.ndarray, base: int):
        self.limbs, self.base = limbs, base

    @classmethod
    def of(cls, v: np.ndarray) -> Exact | None:
        """None where the integers would not stay small or a sum could round twice (values not
        finite, or far apart in magnitude, or near the edges of a float's range): the engine's."""
        if not np.isfinite(v).all():
            return None
        fractions, exponents = np.frexp(v)
        mantissas = (fractions * 2.0**53).astype(np.int64)  # exact: a double has 53 bits
        exponents = exponents.astype(np.int64) - 53
        nonzero = mantissas != 0
        if not nonzero.any():
            return cls(np.zeros((1, len(v)), dtype=np.int64), 0)
        base = int(exponents[nonzero].min())
        shifts = np.where(nonzero, exponents - base, 0)
        if base < -1000 or int(shifts.max()) > 900 or int(exponents.max()) + 53 + len(v).bit_length() >= 1024:
            return None  # the last: a sum could pass the largest float, where the engine's raises
        # Bits of the largest sum of all of them, a sign, and a limb above that stays 0 (`floats`).
        bits = 53 + int(shifts.max()) + max(1, len(v)).bit_length() + 1
        limbs = np.empty((math.ceil(bits / BITS) + 1, len(v)), dtype=np.int64)
        magnitudes, signs = np.abs(mantissas).astype(np.uint64), np.sign(mantissas)
        for k in range(len(limbs)):
            # Bits 31k.. of m << s: m's bits from 31k - s, or m shifted up where s passes 31k.
            down = BITS * k - shifts
            part = np.where(
                down >= 0,
                np.right_shift(magnitudes, np.clip(down, 0, 63).astype(np.uint64)),
                np.left_shift(magnitudes, np.clip(-down, 0, 63).astype(np.uint64)),
            )
            part[(down >= 64) | (down <= -BITS)] = 0
            limbs[k] = (part & np.uint64(_MASK)).astype(np.int64) * signs
        return cls(limbs, base)

    def take(self, which: np.ndarray) -> Exact:
        return Exact(self.limbs[:, which], self.base)

    def window_sums(self, lo: np.ndarray, wanted: np.ndarray) -> np.ndarray:
        """Each value's sum with those before it from `lo` (a position per value), as floats, at
        the `wanted` positions (NaN elsewhere: a held record's sum is not read again)."""
        prefix = np.zeros((len(self.limbs), self.limbs.shape[1] + 1), dtype=np.int64)
        np.cumsum(self.limbs, axis=1, out=prefix[:, 1:])
        return self._at(wanted, prefix[:, wanted + 1] - prefix[:, lo[wanted]])

    def running_sums(self, code: np.ndarray, starts: np.ndarray, wanted: np.ndarray) -> np.ndarray:
        """Each value's running sum within its (key, window start), in arrival order (a tumbling
        window's records need not be together: a late one lands in an earlier window), as floats,
        at the `wanted` positions (NaN elsewhere)."""
        order = np.lexsort((starts, code))  # stable: arrival order within a window
        c, s = code[order], starts[order]
        first = np.concatenate([[True], (c[1:] != c[:-1]) | (s[1:] != s[:-1])])
        begins = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        prefix = np.zeros((len(self.limbs), len(order) + 1), dtype=np.int64)
        np.cumsum(self.limbs[:, order], axis=1, out=prefix[:, 1:])
        place = np.empty(len(order), dtype=np.int64)
        place[order] = np.arange(len(order))  # where each value went in `order`
        at = place[wanted]
        return self._at(wanted, prefix[:, at + 1] - prefix[:, begins[at]])

    def _at(self, wanted: np.ndarray, sums: np.ndarray) -> np.ndarray:
        out = np.full(self.limbs.shape[1], np.nan)
        out[wanted] = self.floats(sums)
        return out

    def floats(self, sums: np.ndarray) -> np.ndarray:
        """Sums given as limbs (any int64 each) as floats, each rounded once to the nearest."""
        limbs = _carried(sums.copy())
        negative = limbs[-1] < 0
        if negative.any():
            limbs[:, negative] = _carried(-limbs[:, negative])
        count, n = limbs.shape
        # Three limbs of 0 below, so that the two under the highest always exist.
        padded = np.concatenate([np.zeros((3, n), dtype=np.int64), limbs])
        nonzero = padded != 0
        top = count + 2 - np.argmax(nonzero[::-1], axis=0)  # the highest nonzero limb's row (zero: none)
        columns = np.arange(n)
        high = (padded[top, columns] << BITS) | padded[top - 1, columns]  # 32 to 62 bits: the spare limb keeps it below 2^62
        # 0 to 30: 61 or 62 bits after it (a float of high may round up to the next power of two).
        shift = np.clip(62 - np.frexp(high.astype(np.float64))[1], 0, BITS - 1)
        below = padded[top - 2, columns]
        kept = (high << shift) | (below >> (BITS - shift))
        dropped = (below & ((1 << (BITS - shift)) - 1)) != 0
        dropped |= np.logical_or.accumulate(nonzero, axis=0)[top - 3, columns]
        # A sticky bit: any bit dropped moves a tie, or a value below one, to the right side.
        rounded = (kept | dropped.astype(np.int64)).astype(np.float64)
        out = np.ldexp(rounded, BITS * (top - 4) - shift + self.base)  # a sum of 0: 0.0, as kept is 0
        return np.where(negative, -out, out)


def _carried(limbs: np.ndarray) -> np.ndarray:
    """The same integers with every limb but the top one in [0, 2^31): the top one holds the sign."""
    for k in range(len(limbs) - 1):
        carry = limbs[k] >> BITS
        limbs[k] -= carry << BITS
        limbs[k + 1] += carry
    return limbs
