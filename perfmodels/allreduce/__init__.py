"""The learned allreduce model of Srifty 4.2: XGBoost regressors on the bus
bandwidth measured by the grid probe (`thrifty.runtime.measure.probe`).

Four modules: `table` (probe rows and their schema `ProbeRow`), `fitting`
(training and model selection, with xgboost), `model` (features, prediction,
saved form and its schema `AllreduceModelFile`), `trees` (the saved boosters
evaluated in numpy, as xgboost evaluates them: predicting never imports
xgboost, which would pull scikit-learn, scipy.stats and pandas onto the path
of ``thrifty solve``).

Label: the per-transfer bus bandwidth ``busbw = 2 s (n - 1) / (n t)`` of each
probe row (``s`` buffer bytes, ``n`` world size, ``t`` the batch time of
``concurrent`` transfers started together).

Features (one row per query)::

    log2(buffer bytes), world size, instances, gpus per instance,
    concurrent transfers, rated network gbps,
    one-hot of the device, one-hot of the instance type

Two submodels (Srifty 4.2): ``small`` for ``s <= MTU`` and ``large`` for
``s > MTU`` (``MTU_BYTES`` = 9001, EC2 jumbo frames); one model over both
regimes predicts nonsense for small buffers.

Model selection (per submodel), by weighted MAPE on rows never trained on,
with whole *groups* ``(instance type, world size, instances, buffer bytes)``
held out (every repeat and concurrency level of a group together), so a
score measures prediction at a buffer size the booster has not seen for that
world size, not memory of a repeated cell:

1. test: a seeded draw of 20% of the groups (`holdout_fraction`) is set
   aside and used once, for the *held-out MAPE* reported;
2. selection: the other groups are split (seeded) into 5 folds; each grid
   point (max_depth, n_estimators, learning_rate, objective incl.
   ``reg:pseudohubererror``, target busbw / log busbw / log time) is trained
   on 4 folds and predicts the fifth, and the point with the lowest
   out-of-fold MAPE wins (one noisy validation split picks poorly on noisy
   probes of a shared host);
3. the winner is trained on all non-test rows and scored on test, then
   refitted on all rows: that booster is the one kept.

Only groups strictly inside the probed size range of their (type, world
size) are held out (test or fold): trees predict flat beyond the data, and
the model is meant to interpolate between probed sizes (the simulator's
layer sizes). The report also gives the MAPE of the same test predictions
against the median of each test cell (how well the typical value is
predicted, without the repeat-to-repeat noise) and a noise floor: rows of one cell
(type, world size, instances, buffer, concurrency) share every feature, so
any model predicts one value per cell; the floor is the test MAPE of the
best such value per cell, chosen with hindsight (Srifty 4.2: repeated
probes of one configuration disagree, so no model gets below it).

Stale probes can be decayed (Srifty 4.2, "Model Updating"): with a half-life
of ``h`` days a row ``a`` days older than the newest row weighs ``0.5**(a/h)``
in training and in the MAPE.

``b_cap`` (Srifty 4.3), per (type, world size, instances): the largest
aggregate bus bandwidth ``c * busbw`` over concurrency levels ``c`` and
buffer sizes above the MTU, taking the larger of what was observed (median
over repeats of a cell) and what the model predicts on the probed grid.

Between two probed buffer sizes the allreduce time is interpolated linearly
in log2(size) between the boosters' answers at the two (a deviation from
querying the trees directly: trees are constant between their split points,
so a size between two probes would get the time of one of them, up to 2x
off on a doubling grid). Outside the probed buffer sizes of a type the alpha-beta limits take over
(latency-bound below, bandwidth-bound above); world sizes outside the probed
ones are extrapolated flat by the trees, so probe the world sizes you plan
for.

Types without probes are answered by a fallback model (by default the
analytic ring `AnalyticAllreduce`) and `source` says ``"analytic"``.
"""

from thrifty.perfmodels.allreduce.fitting import (
    DEFAULT_GRID,
    MAPE_WEIGHTED_GRID,
    decay_weights,
    fit_allreduce,
    group_folds,
    mape,
    mape_floor,
    split_groups,
)
from thrifty.perfmodels.allreduce.model import (
    MIN_BUS_BANDWIDTH,
    MODEL_FORMAT,
    NUMERIC_FEATURES,
    TARGETS,
    AllreduceModelFile,
    Hyperparams,
    LearnedAllreduce,
    SubmodelReport,
    TypeCoverage,
    load_allreduce_model,
)
from thrifty.perfmodels.allreduce.table import (
    PROBE_COLUMNS,
    ProbeRow,
    ProbeTable,
    file_digest,
    load_probes,
    parse_probe_rows,
    pool_repeats,
)

__all__ = [
    "MODEL_FORMAT",
    "MIN_BUS_BANDWIDTH",
    "PROBE_COLUMNS",
    "NUMERIC_FEATURES",
    "ProbeRow",
    "ProbeTable",
    "load_probes",
    "parse_probe_rows",
    "pool_repeats",
    "Hyperparams",
    "TARGETS",
    "DEFAULT_GRID",
    "MAPE_WEIGHTED_GRID",
    "SubmodelReport",
    "TypeCoverage",
    "LearnedAllreduce",
    "AllreduceModelFile",
    "fit_allreduce",
    "load_allreduce_model",
    "mape",
    "mape_floor",
    "decay_weights",
    "split_groups",
    "group_folds",
    "file_digest",
]
