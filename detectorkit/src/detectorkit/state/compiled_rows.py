"""A typed store's list rows copied out and in, and its changelog values' bytes gathered, by
compiled loops, for a detector that runs on its store's columns (`in_store`, which has loaded numba
already): NumPy's copies build an index per value or byte (`columns._within`, `codec._Pieces`) and
take every one through it, these copy each row or piece as a run."""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def gather(source, starts, lengths, out):
    """Each run of `source` (lengths[i] values from starts[i]) into `out`, one after another: a
    store's rows (from its list column's pool), a changelog value's pieces of text."""
    at = 0
    for i in range(len(starts)):
        begin = starts[i]
        for j in range(lengths[i]):
            out[at + j] = source[begin + j]
        at += lengths[i]


@njit(cache=True)
def scatter(flat, starts, values, lengths):
    """`gather` the other way: runs of `values`, one after another, to `starts` of `flat`."""
    at = 0
    for i in range(len(starts)):
        begin = starts[i]
        for j in range(lengths[i]):
            flat[begin + j] = values[at + j]
        at += lengths[i]
