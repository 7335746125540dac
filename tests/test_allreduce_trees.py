"""xgboost's tree models evaluated in numpy (`TreeEnsemble`) predict what xgboost
predicts: checked against xgboost's own ``Booster.inplace_predict`` on random
inputs with missing values, for every objective family (identity, logistic,
exponential), user-set and estimated base scores, deep trees, dart boosters and
the shipped allreduce model's boosters; and a document it cannot evaluate is
refused with the reason."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from thrifty.perfmodels.allreduce.trees import TreeEnsemble, TreeModelError
from thrifty.perfmodels.loading import SHIPPED_LOCAL_MODEL


def xgboost():
    """xgboost, imported by the tests that compare with it (a skip without it): not at collection, where
    every parallel worker would import it (a second of CPU each) whether it runs these tests or not."""
    return pytest.importorskip("xgboost")


RTOL = 1e-6


def _inputs(rng: np.random.Generator, rows: int, columns: int, missing: float = 0.2) -> np.ndarray:
    X = rng.normal(size=(rows, columns)) * 2
    X[rng.random(X.shape) < missing] = np.nan
    return X


def _trained(objective: str, seed: int, base_score: float | None = None, booster: str = "gbtree",
             depth: int = 5, rounds: int = 40) -> object:
    rng = np.random.default_rng(seed)
    X = _inputs(rng, 400, 6, missing=0.1)
    signal = np.nansum(X[:, :3] * [1.0, -0.5, 0.25], axis=1) + 0.3 * np.nan_to_num(X[:, 3]) ** 2
    if objective in ("reg:logistic", "binary:logistic", "binary:logitraw"):
        y = (signal > 0).astype(float)
    elif objective in ("count:poisson", "reg:gamma", "reg:tweedie"):
        y = np.exp(signal / 4)
    else:
        y = signal
    params = {"objective": objective, "max_depth": depth, "eta": 0.2, "verbosity": 0, "seed": seed,
              "booster": booster, "nthread": 1}
    if base_score is not None:
        params["base_score"] = base_score
    if booster == "dart":
        params["rate_drop"] = 0.2
    xgb = xgboost()
    return xgb.train(params, xgb.DMatrix(X, label=y), num_boost_round=rounds)


def _document(booster) -> dict:
    return json.loads(bytes(booster.save_raw("json")))


@pytest.mark.parametrize("objective, base_score", [
    ("reg:squarederror", None), ("reg:squarederror", 0.7), ("reg:pseudohubererror", 1.0),
    ("reg:absoluteerror", None), ("binary:logitraw", None), ("reg:logistic", 0.3), ("binary:logistic", None),
    ("count:poisson", None), ("reg:gamma", 2.0), ("reg:tweedie", None),
])
def test_predictions_are_xgboosts(objective, base_score):
    for seed in range(2):
        booster = _trained(objective, seed, base_score)
        trees = TreeEnsemble.from_json(_document(booster))
        X = _inputs(np.random.default_rng(100 + seed), 3000, 6)
        ours, theirs = trees.predict(X), booster.inplace_predict(X)
        assert ours.dtype == np.float32
        np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=0)
        np.testing.assert_allclose(trees.predict_margin(X), booster.inplace_predict(X, predict_type="margin"),
                                   rtol=RTOL, atol=1e-6)


def test_deep_trees_values_on_split_points_and_infinities_go_as_in_xgboost():
    booster = _trained("reg:squarederror", 3, depth=12, rounds=15)
    doc = _document(booster)
    trees = TreeEnsemble.from_json(doc)
    # inputs exactly at the split conditions (x < split goes left: equality goes right), and +-inf
    splits = np.array([c for t in doc["learner"]["gradient_booster"]["model"]["trees"]
                       for c, left in zip(t["split_conditions"], t["left_children"]) if left != -1], np.float32)
    rng = np.random.default_rng(0)
    X = rng.choice(np.concatenate([splits, [np.inf, -np.inf, np.nan]]), size=(2000, 6)).astype(float)
    np.testing.assert_array_equal(trees.predict(X), booster.inplace_predict(X))


def test_a_dart_booster_scales_each_tree_by_its_weight():
    booster = _trained("reg:squarederror", 1, booster="dart")
    trees = TreeEnsemble.from_json(_document(booster))
    X = _inputs(np.random.default_rng(5), 2000, 6)
    theirs = booster.inplace_predict(X)
    # dart sums the scaled trees in another order than gbtree: equal to float32 rounding of the sum's size
    np.testing.assert_allclose(trees.predict(X), theirs, rtol=RTOL, atol=1e-6 * np.max(np.abs(theirs)))


def test_the_shipped_allreduce_boosters_predict_as_xgboost_loads_them():
    shipped = json.loads(SHIPPED_LOCAL_MODEL.read_text())
    rng = np.random.default_rng(7)
    for name in ("small", "large"):
        doc = shipped["submodels"][name]["booster"]
        booster = xgboost().Booster()
        booster.load_model(bytearray(json.dumps(doc).encode()))
        trees = TreeEnsemble.from_json(doc)
        columns = trees.num_features
        X = np.column_stack([rng.uniform(0, 30, 2000), rng.integers(1, 9, (2000, 4)).astype(float),
                             rng.uniform(0, 100, 2000), rng.integers(0, 2, (2000, columns - 6)).astype(float)])
        np.testing.assert_array_equal(trees.predict(X), booster.inplace_predict(X))


def test_the_learned_model_predicts_without_importing_xgboost():
    import subprocess
    import sys

    code = ("import sys; import numpy as np\n"
            "from thrifty.perfmodels.allreduce import load_allreduce_model\n"
            "from thrifty.datasets.catalog import load_catalog\n"
            "from thrifty.perfmodels.loading import SHIPPED_LOCAL_MODEL\n"
            "m = load_allreduce_model(SHIPPED_LOCAL_MODEL)\n"
            "b = m.bus_bandwidth(load_catalog().get('local'), np.array([1e3, 1e6, 3e7]), 2, 2)\n"
            "assert np.all(b > 0), b\n"
            "print(sorted(k for k in ('xgboost', 'sklearn', 'pandas', 'scipy.stats') if k in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def _tree0(doc: dict) -> dict:
    return doc["learner"]["gradient_booster"]["model"]["trees"][0]


@pytest.fixture(scope="module")
def small_doc() -> dict:
    return _document(_trained("reg:squarederror", 0, depth=3, rounds=3))


def _broken(doc: dict, change) -> dict:
    out = copy.deepcopy(doc)
    change(out)
    return out


@pytest.mark.parametrize("change, message", [
    (lambda d: d["learner"]["objective"].update(name="multi:softmax"), "learner.objective.name is 'multi:softmax'"),
    (lambda d: d["learner"]["learner_model_param"].update(num_class="3"), "num_class is 3; only one output"),
    (lambda d: d["learner"]["gradient_booster"].update(name="gblinear"), "only 'gbtree' and 'dart' are read"),
    (lambda d: _tree0(d).update(split_type=[1] + _tree0(d)["split_type"][1:]), "categorical splits"),
    (lambda d: _tree0(d)["left_children"].__setitem__(0, 0), "reached twice from its root"),
    (lambda d: _tree0(d)["left_children"].__setitem__(0, 99), "a child is not a node of its tree"),
    (lambda d: _tree0(d)["split_indices"].__setitem__(0, 6), "splits on a feature the model does not read"),
    (lambda d: _tree0(d)["right_children"].pop(), "right_children must be a list of"),
    (lambda d: d["learner"]["learner_model_param"].update(base_score="[1E0,2E0]"), "a model of 2 outputs"),
])
def test_a_model_it_cannot_evaluate_is_refused_with_the_reason(small_doc, change, message):
    with pytest.raises(TreeModelError, match=None) as e:
        TreeEnsemble.from_json(_broken(small_doc, change))
    assert message in str(e.value), str(e.value)
