"""xgboost tree ensembles evaluated in numpy, from xgboost's own JSON model
document (``Booster.save_raw("json")``), so that predicting with a saved
allreduce model does not import xgboost (which pulls in scikit-learn, scipy.stats
and pandas: about a second on the path of ``thrifty solve``).

The prediction is xgboost's, step for step (its CPU predictor):

1. the input is cast to float32; a NaN is a missing value;
2. in each tree, from the root: a missing value goes to the node's default
   child (``default_left``), any other value ``x`` goes left when
   ``x < split_condition`` (float32), else right; a leaf's value is its
   ``split_conditions`` entry (xgboost stores the leaf value there);
3. the margin starts at the base score, turned into margin space by the
   objective's link (``ProbToMargin``: logit for the logistic objectives, log
   for the exponential ones, identity for the others; rounded as xgboost
   rounds it, see `_LINKS`), and adds the trees'
   leaves in tree order, in float32 (a ``dart`` booster scales each tree by
   its ``weight_drop``);
4. the objective's inverse link (``PredTransform``) turns the margin into
   the prediction.

What this reader does not evaluate it refuses with the reason (a
`TreeModelError`), never predicts wrongly: categorical splits, vector leaves
(multi-target trees), more than one output group (multi-class), ``gblinear``,
and objectives outside `_LINKS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["TreeEnsemble", "TreeModelError"]


class TreeModelError(ValueError):
    """A JSON document that is not an xgboost tree model this module evaluates."""


# Each objective's ProbToMargin (base score -> margin, float32) and PredTransform (margin -> prediction), with
# the arithmetic xgboost 3 does: from a base score as written (`score`, parsed as a float64) and whether
# xgboost estimated it from the labels (`estimated`: boost_from_average), each rounding as xgboost's does, so
# that the margins agree to the bit (checked against xgboost in tests/test_allreduce_trees.py).


def _no_link(score: float, estimated: bool) -> np.float32:
    return np.float32(score)


def _logit(score: float, estimated: bool) -> np.float32:
    if estimated:  # in float32
        one = np.float32(1.0)
        return np.float32(-np.log(one / np.float32(score) - one))
    return np.float32(-np.log(1.0 / score - 1.0))


def _log(score: float, estimated: bool) -> np.float32:
    return np.float32(np.log(float(np.float32(score))))


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _sigmoid(x: np.ndarray) -> np.ndarray:
    one = np.float32(1.0)
    return one / (one + np.exp(-x))


def _exp(x: np.ndarray) -> np.ndarray:
    return np.exp(x.astype(np.float64)).astype(np.float32)


_IDENTITY = (_no_link, _identity)
_LOGISTIC = (_logit, _sigmoid)
_EXPONENTIAL = (_log, _exp)
_LINKS: dict[str, tuple[Any, Any]] = {
    "reg:squarederror": _IDENTITY,
    "reg:squaredlogerror": _IDENTITY,
    "reg:pseudohubererror": _IDENTITY,
    "reg:absoluteerror": _IDENTITY,
    "reg:linear": _IDENTITY,
    "binary:logitraw": _IDENTITY,
    "rank:pairwise": _IDENTITY,
    "rank:ndcg": _IDENTITY,
    "rank:map": _IDENTITY,
    "reg:logistic": _LOGISTIC,
    "binary:logistic": _LOGISTIC,
    "count:poisson": _EXPONENTIAL,
    "reg:gamma": _EXPONENTIAL,
    "reg:tweedie": _EXPONENTIAL,
}


def _number(text: Any, what: str) -> float:
    """xgboost writes its parameters as strings; the base score as ``"5E-1"`` or, since 2.0, ``"[5E-1]"``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    if not isinstance(text, str):
        raise TreeModelError(f"{what} is {text!r}, but must be a number")
    inner = text.strip()
    if inner.startswith("[") and inner.endswith("]"):
        parts = [p for p in inner[1:-1].split(",") if p.strip()]
        if len(parts) != 1:
            raise TreeModelError(f"{what} is {text!r}: a model of {len(parts)} outputs; only one output is read")
        inner = parts[0]
    try:
        return float(inner)
    except ValueError:
        raise TreeModelError(f"{what} is {text!r}, but must be a number") from None


def _get(obj: Any, key: str, where: str) -> Any:
    if not isinstance(obj, Mapping) or key not in obj:
        raise TreeModelError(f"{where}.{key} is missing" if where else f"{key} is missing")
    return obj[key]


_NODE_FIELDS = ("left_children", "right_children", "split_indices", "default_left", "split_conditions")


@dataclass(frozen=True)
class _Nodes:
    """The nodes of all trees, concatenated (global indices); a leaf leads to itself, so that every walk may
    take the deepest tree's number of steps."""

    offsets: np.ndarray  # each tree's root
    left: np.ndarray
    right: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray  # float32: a split's condition, or a leaf's value
    default_left: np.ndarray
    depth: int  # of the deepest tree


def _tree_lists(tree: Any, where: str) -> tuple[int, list[Sequence[Any]]]:
    """One tree's node count and its `_NODE_FIELDS` lists, each of that length."""
    param = _get(tree, "tree_param", where)
    n = int(_number(_get(param, "num_nodes", f"{where}.tree_param"), f"{where}.tree_param.num_nodes"))
    if n < 1:
        raise TreeModelError(f"{where}.tree_param.num_nodes is {n}, but a tree has at least its root")
    if int(_number(param.get("size_leaf_vector", "1"), f"{where}.tree_param.size_leaf_vector")) > 1:
        raise TreeModelError(f"{where} has vector leaves (a multi-target tree); only scalar leaves are read")
    if any(t != 0 for t in tree.get("split_type") or ()):
        raise TreeModelError(f"{where} has categorical splits; only numerical splits are read")
    lists = []
    for key in _NODE_FIELDS:
        values = _get(tree, key, where)
        if not isinstance(values, Sequence) or isinstance(values, str) or len(values) != n:
            raise TreeModelError(f"{where}.{key} must be a list of {n} numbers (tree_param.num_nodes)")
        lists.append(values)
    return n, lists


def _read_nodes(trees: Sequence[Any], where: str, num_feature: int) -> _Nodes:
    """All trees' nodes, checked: two children or none, every child a node of its tree, every split feature
    one the model reads, and from each root a tree (no node reached twice, so no cycle)."""
    sizes, columns = [], [[] for _ in _NODE_FIELDS]  # type: list[int], list[list[Any]]
    for i, tree in enumerate(trees):
        n, lists = _tree_lists(tree, f"{where}[{i}]")
        sizes.append(n)
        for column, values in zip(columns, lists):
            column.extend(values)
    try:
        left, right, feature, default_left = (np.asarray(c, dtype=np.int64) for c in columns[:4])
        threshold = np.asarray(columns[4], dtype=np.float64).astype(np.float32)
    except (TypeError, ValueError, OverflowError):
        raise TreeModelError(f"{where}: the node lists must hold numbers") from None
    size = np.asarray(sizes, dtype=np.int64)
    offsets = np.cumsum(size) - size
    tree_of = np.repeat(np.arange(len(size)), size)

    def fail(at: np.ndarray, what: str) -> TreeModelError:
        node = int(np.argmax(at))
        return TreeModelError(f"{where}[{tree_of[node]}] node {node - offsets[tree_of[node]]}: {what}")

    leaf = left == -1
    if np.any(leaf != (right == -1)):
        raise fail(leaf != (right == -1), "has one child; each node has two or none")
    inner = ~leaf
    for children in (left, right):
        if np.any(inner & ((children < 0) | (children >= size[tree_of]))):
            raise fail(inner & ((children < 0) | (children >= size[tree_of])), "a child is not a node of its tree")
    if np.any(inner & ((feature < 0) | (feature >= num_feature))):
        raise fail(inner & ((feature < 0) | (feature >= num_feature)), f"splits on a feature the model does not "
                   f"read (it reads {num_feature})")
    own = np.arange(len(left))
    left = np.where(leaf, own, left + offsets[tree_of])
    right = np.where(leaf, own, right + offsets[tree_of])
    reached = np.zeros(len(left), dtype=bool)
    reached[offsets] = True
    level, depth = offsets[inner[offsets]], 0
    while len(level):
        depth += 1
        children = np.concatenate([left[level], right[level]])
        if np.any(reached[children]) or np.bincount(children, minlength=len(left)).max() > 1:
            raise TreeModelError(f"{where}: a node is reached twice from its root; the nodes are not a tree")
        reached[children] = True
        level = children[inner[children]]
    return _Nodes(offsets, left, right, np.where(leaf, 0, feature), threshold, default_left.astype(bool), depth)


@dataclass(frozen=True)
class TreeEnsemble:
    """An xgboost tree model (``gbtree`` or ``dart``) as flat numpy arrays.

    All trees' nodes are concatenated (`_Nodes`); a prediction
    walks every (row, tree) pair at once for as many steps as the deepest tree.
    `document` is the JSON the model was read from (saved as it came).
    """

    document: Mapping[str, Any]
    num_features: int
    objective: str
    base_margin: np.float32
    _nodes: _Nodes
    _weights: np.ndarray | None  # dart: each tree's weight_drop

    @classmethod
    def from_json(cls, document: Any) -> "TreeEnsemble":
        """Read xgboost's JSON model document; a `TreeModelError` says what it cannot read."""
        learner = _get(document, "learner", "")
        param = _get(learner, "learner_model_param", "learner")
        num_feature = int(_number(_get(param, "num_feature", "learner.learner_model_param"),
                                  "learner.learner_model_param.num_feature"))
        for key in ("num_class", "num_target"):
            count = int(_number(param.get(key, "0"), f"learner.learner_model_param.{key}"))
            if count > 1:
                raise TreeModelError(f"learner.learner_model_param.{key} is {count}; only one output is read")
        objective = _get(_get(learner, "objective", "learner"), "name", "learner.objective")
        if objective not in _LINKS:
            raise TreeModelError(f"learner.objective.name is {objective!r}; the objectives read are "
                                 f"{', '.join(sorted(_LINKS))}")
        to_margin, _ = _LINKS[objective]
        base_score = _number(_get(param, "base_score", "learner.learner_model_param"),
                             "learner.learner_model_param.base_score")
        estimated = _number(param.get("boost_from_average", "0"), "learner.learner_model_param.boost_from_average")
        with np.errstate(all="raise"):
            try:
                base_margin = to_margin(base_score, bool(estimated))
            except (ValueError, ZeroDivisionError, FloatingPointError):
                base_margin = np.float32(np.nan)
        if not np.isfinite(base_margin):
            raise TreeModelError(f"learner.learner_model_param.base_score {base_score:g} is outside the range "
                                 f"of {objective}")
        booster = _get(learner, "gradient_booster", "learner")
        kind = _get(booster, "name", "learner.gradient_booster")
        weights = None
        if kind == "gbtree":
            model, where = _get(booster, "model", "learner.gradient_booster"), "learner.gradient_booster.model"
        elif kind == "dart":
            inner = _get(booster, "gbtree", "learner.gradient_booster")
            model, where = _get(inner, "model", "learner.gradient_booster.gbtree"), \
                "learner.gradient_booster.gbtree.model"
            try:
                weights = np.asarray(_get(booster, "weight_drop", "learner.gradient_booster"), dtype=np.float32)
            except (TypeError, ValueError):
                raise TreeModelError("learner.gradient_booster.weight_drop must be a list of numbers") from None
        else:
            raise TreeModelError(f"learner.gradient_booster.name is {kind!r}; only 'gbtree' and 'dart' are read")
        trees = _get(model, "trees", where)
        if not isinstance(trees, Sequence) or isinstance(trees, str):
            raise TreeModelError(f"{where}.trees must be a list")
        info = model.get("tree_info", [0] * len(trees))
        if not isinstance(info, Sequence) or len(info) != len(trees) or any(g != 0 for g in info):
            raise TreeModelError(f"{where}.tree_info: only trees of one output group (0) are read")
        if weights is not None and len(weights) != len(trees):
            raise TreeModelError(f"learner.gradient_booster.weight_drop has {len(weights)} weights for "
                                 f"{len(trees)} trees")
        nodes = _read_nodes(trees, f"{where}.trees", num_feature)
        return cls(
            document=document, num_features=num_feature, objective=objective, base_margin=base_margin,
            _nodes=nodes, _weights=weights,
        )

    def predict_margin(self, X: np.ndarray) -> np.ndarray:
        """The untransformed sum (float32) of each row of `X` (rows x `num_features`)."""
        x = np.asarray(X, dtype=np.float64).astype(np.float32)
        if x.ndim != 2 or x.shape[1] != self.num_features:
            raise ValueError(f"X has shape {x.shape}, but the model reads {self.num_features} features per row")
        nodes = self._nodes
        rows = np.arange(len(x))[:, None]
        node = np.broadcast_to(nodes.offsets, (len(x), len(nodes.offsets)))
        for _ in range(nodes.depth):
            value = x[rows, nodes.feature[node]]
            go_left = np.where(np.isnan(value), nodes.default_left[node], value < nodes.threshold[node])
            node = np.where(go_left, nodes.left[node], nodes.right[node])
        leaves = nodes.threshold[node]
        if self._weights is not None:
            leaves = leaves * self._weights
        # tree by tree in float32, from the base margin: xgboost's order of additions
        start = np.full((len(x), 1), self.base_margin, dtype=np.float32)
        return np.cumsum(np.concatenate([start, leaves], axis=1), axis=1, dtype=np.float32)[:, -1]

    def predict(self, X: np.ndarray) -> np.ndarray:
        """What ``Booster.inplace_predict(X)`` returns (float32): the margin through the objective's link."""
        _, transform = _LINKS[self.objective]
        return np.asarray(transform(self.predict_margin(X)), dtype=np.float32)
