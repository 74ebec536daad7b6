"""A binary tree ensemble (a gradient-boosted classifier as skl2onnx exports it) scored by compiled
code, with ONNX Runtime's numbers bit for bit, or not at all.

ONNX Runtime walks each row down each tree in turn, a chain of dependent loads and unpredictable
branches per tree; here each tree is a complete binary tree in heap order (a leaf above the
deepest level stands for its whole subtree below a threshold of +inf, which every finite value is
under), walked for a block of rows at a time, one level at a time. The sums are the same float32
additions in the same order (tree by tree), and the logistic is ONNX Runtime's
(`ComputeLogistic`: 1 / (1 + exp(-|z|)), mirrored below zero).

What is not such a model (another operator, a branch other than `<=`, a logistic otherwise
applied, more than two classes) gets None, and ONNX Runtime scores it. What is gets checked
against ONNX Runtime first, on rows made to fall on each side of every threshold: a difference in
one bit of one score, and ONNX Runtime scores it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from numba import njit

# Deeper trees make heap arrays of 2^depth nodes per tree: ONNX Runtime walks those.
MAX_DEPTH = 10
BLOCK = 256  # rows walked a level at a time: their node indexes stay in the L1 cache
CHECK_ROWS = 4096


@dataclasses.dataclass(frozen=True)
class Trees:
    features: np.ndarray  # (trees, 2^depth - 1) int64: each inner node's feature, in heap order
    thresholds: np.ndarray  # (trees, 2^depth - 1) float32: a row goes left where its value is <= this
    leaves: np.ndarray  # (trees, 2^depth) float32: each leaf's weight
    base: np.float32

    def score(self, matrix: np.ndarray) -> np.ndarray:
        """The probability of the second class for each row of `matrix` (float32 rows of finite
        numbers), as ONNX Runtime's `probabilities[:, 1]`."""
        by_feature = np.ascontiguousarray(np.asarray(matrix, dtype=np.float32).T)
        return _probabilities(by_feature, self.features, self.thresholds, self.leaves, self.base, np.empty(len(matrix), dtype=np.float32))


@njit(cache=True)
def _probabilities(by_feature, features, thresholds, leaves, base, out):
    trees, inner = features.shape
    depth = 0
    while (1 << depth) - 1 < inner:
        depth += 1
    n = by_feature.shape[1]
    at = np.empty(BLOCK, dtype=np.int64)
    sums = np.empty(BLOCK, dtype=np.float32)
    for start in range(0, n, BLOCK):
        m = min(BLOCK, n - start)
        sums[:m] = 0
        for t in range(trees):
            at[:m] = 0
            for _ in range(depth):
                for j in range(m):
                    h = at[j]
                    at[j] = 2 * h + 2 - (by_feature[features[t, h], start + j] <= thresholds[t, h])
            for j in range(m):
                sums[j] += leaves[t, at[j] - inner]
        for j in range(m):
            z = sums[j] + base
            v = np.float32(1) / (np.float32(1) + np.exp(-np.abs(z)))
            out[start + j] = np.float32(1) - v if z < 0 else v
    return out


def of_onnx(content: bytes) -> Trees | None:
    """The ensemble in an ONNX model's bytes, or None where it is not one this module scores."""
    try:
        import onnx
        from onnx import helper
    except ImportError:
        return None
    try:
        graph = onnx.load_from_string(content).graph
    except Exception:  # noqa: BLE001 - ONNX Runtime loaded it: its verdict stands
        return None
    kinds = [node.op_type for node in graph.node]
    if kinds.count("TreeEnsembleClassifier") != 1 or set(kinds) - {"TreeEnsembleClassifier", "Identity"}:
        return None
    node = graph.node[kinds.index("TreeEnsembleClassifier")]
    if len(graph.input) != 1 or list(node.input) != [graph.input[0].name]:
        return None
    a = {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}
    if (
        a.get("post_transform") != b"LOGISTIC"
        or len(a.get("base_values", [])) != 1
        or len(a.get("classlabels_int64s", a.get("classlabels_strings", []))) != 2
        or set(a.get("class_ids", [])) != {0}
        or set(a.get("nodes_modes", [])) - {b"BRANCH_LEQ", b"LEAF"}
        or any(name.endswith("_as_tensor") for name in a)
    ):
        return None
    return _heaps(a)


def _heaps(a: dict[str, Any]) -> Trees | None:
    """Each tree of the ensemble's attributes as a complete tree in heap order."""
    at = {(t, i): k for k, (t, i) in enumerate(zip(a["nodes_treeids"], a["nodes_nodeids"], strict=True))}
    weight: dict[tuple[int, int], np.float32] = {}
    for t, i, w in zip(a["class_treeids"], a["class_nodeids"], a["class_weights"], strict=True):
        weight[(t, i)] = np.float32(weight.get((t, i), np.float32(0)) + np.float32(w))
    leaf = [mode == b"LEAF" for mode in a["nodes_modes"]]
    trees = sorted({t for t, _ in at})
    if trees != list(range(len(trees))) or any((t, 0) not in at for t in trees):
        return None

    def depth(t: int, i: int, d: int) -> int:
        k = at[(t, i)]
        if leaf[k] or d > MAX_DEPTH:
            return d
        return max(depth(t, a["nodes_truenodeids"][k], d + 1), depth(t, a["nodes_falsenodeids"][k], d + 1))

    try:
        deepest = max(depth(t, 0, 0) for t in trees)
    except KeyError:  # a child that is no node
        return None
    if deepest > MAX_DEPTH:
        return None
    inner = 2**deepest - 1
    features = np.zeros((len(trees), inner), dtype=np.int64)
    thresholds = np.full((len(trees), inner), np.inf, dtype=np.float32)
    leaves = np.zeros((len(trees), 2**deepest), dtype=np.float32)

    def place(t: int, i: int, h: int, d: int) -> None:
        k = at[(t, i)]
        if leaf[k]:
            first = (h - (2**d - 1)) * 2 ** (deepest - d)  # its subtree's leftmost leaf, at the deepest level
            leaves[t, first : first + 2 ** (deepest - d)] = weight.get((t, i), np.float32(0))
            return
        features[t, h], thresholds[t, h] = a["nodes_featureids"][k], a["nodes_values"][k]
        place(t, a["nodes_truenodeids"][k], 2 * h + 1, d + 1)
        place(t, a["nodes_falsenodeids"][k], 2 * h + 2, d + 1)

    for t in trees:
        place(t, 0, 0, 0)
    return Trees(features, thresholds, leaves, np.float32(a["base_values"][0]))


def checked(trees: Trees | None, reference: Any, width: int) -> Trees | None:
    """`trees` if it scores as `reference(matrix)` (ONNX Runtime's scores, float32) does, bit for
    bit, rows on both sides of each threshold and at it; None otherwise. What it guards against is
    a difference of the machine's or the library's (another exp, another order of the sums), which
    shows in most rows; the construction gives the rest."""
    if trees is None or int(trees.features.max(initial=0)) >= width:
        return None
    rng = np.random.default_rng(0)
    matrix = rng.normal(0, 1e3, size=(CHECK_ROWS, width)).astype(np.float32)
    inner = trees.thresholds < np.inf
    for f in range(width):
        cuts = trees.thresholds[inner & (trees.features == f)]
        if len(cuts):
            near = np.concatenate([cuts, np.nextafter(cuts, np.float32(-np.inf)), np.nextafter(cuts, np.float32(np.inf))])
            matrix[:, f] = np.resize(rng.permutation(near), CHECK_ROWS)  # each of them in a row (of up to CHECK_ROWS)
    expected = np.asarray(reference(matrix), dtype=np.float32)
    return trees if np.array_equal(trees.score(matrix).view(np.int32), expected.view(np.int32)) else None
