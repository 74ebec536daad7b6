"""A typed store's list rows copied out and in, and its changelog values' bytes gathered, by
compiled loops, for a detector that runs on its store's columns (`in_store`, which has loaded numba
already): NumPy's copies build an index per value or byte (`columns._within`, `codec._Pieces`) and
take every one through it, these copy each row or piece as a run."""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def gather(flat, width, slots, lengths, out):
    """Each slot's row (its first lengths[k] values of a matrix `width` wide, `flat` its values
    row by row) into `out`, one after another."""
    at = 0
    for k in range(len(slots)):
        base = slots[k] * width
        for j in range(lengths[k]):
            out[at + j] = flat[base + j]
        at += lengths[k]


@njit(cache=True)
def scatter(flat, width, slots, values, lengths):
    """`gather` the other way: each slot's row from `values`, one after another."""
    at = 0
    for k in range(len(slots)):
        base = slots[k] * width
        for j in range(lengths[k]):
            flat[base + j] = values[at + j]
        at += lengths[k]


@njit(cache=True)
def pieces(source, starts, lengths, out):
    """Each piece of `source` (starts[i], lengths[i] bytes) into `out`, one after another."""
    at = 0
    for i in range(len(starts)):
        begin = starts[i]
        for j in range(lengths[i]):
            out[at + j] = source[begin + j]
        at += lengths[i]
