"""The standard normal quantile function in numpy, for the simulators on the
path of ``thrifty solve``: importing ``scipy.special`` for its ``ndtri`` loads
scipy's array-API layer and numpy.f2py, which takes longer than a whole plan
search of the main job.

`normal_quantile` is Wichura's algorithm AS 241 (PPND16, Applied Statistics
37(3), 1988), the one CPython's ``statistics.NormalDist.inv_cdf`` uses,
vectorized: relative error about 1e-16, so it agrees with ``scipy.special.ndtri``
to the last bit or two.
"""

from __future__ import annotations

import numpy as np

__all__ = ["normal_quantile"]

# AS 241 coefficients, highest power first (np.polyval's order)
_A = (2509.0809287301226727, 33430.575583588128105, 67265.770927008700853, 45921.953931549871457,
      13731.693765509461125, 1971.5909503065514427, 133.14166789178437745, 3.387132872796366608)
_B = (5226.495278852545925, 28729.085735721942674, 39307.89580009271061, 21213.794301586595867,
      5394.1960214247511077, 687.1870074920579083, 42.313330701600911252, 1.0)
_C = (7.7454501427834140764e-4, 0.0227238449892691845833, 0.24178072517745061177, 1.27045825245236838258,
      3.64784832476320460504, 5.7694972214606914055, 4.6303378461565452959, 1.42343711074968357734)
_D = (1.05075007164441684324e-9, 5.475938084995344946e-4, 0.0151986665636164571966, 0.14810397642748007459,
      0.68976733498510000455, 1.6763848301838038494, 2.05319162663775882187, 1.0)
_E = (2.01033439929228813265e-7, 2.71155556874348757815e-5, 0.0012426609473880784386, 0.026532189526576123093,
      0.29656057182850489123, 1.7848265399172913358, 5.4637849111641143699, 6.6579046435011037772)
_F = (2.04426310338993978564e-15, 1.4215117583164458887e-7, 1.8463183175100546818e-5, 7.868691311456132591e-4,
      0.0148753612908506148525, 0.13692988092273580531, 0.59983220655588793769, 1.0)


def normal_quantile(p: np.ndarray | float) -> np.ndarray:
    """``x`` with ``P(Z <= x) = p`` for a standard normal ``Z``, elementwise (``-inf`` at 0, ``inf`` at 1,
    NaN outside [0, 1])."""
    p = np.asarray(p, dtype=float)
    q = p - 0.5
    out = np.empty_like(p)
    central = np.abs(q) <= 0.425
    if central.any():
        qc = q[central]
        r = 0.180625 - qc * qc
        out[central] = qc * np.polyval(_A, r) / np.polyval(_B, r)
    tails = ~central
    if tails.any():
        qt, pt = q[tails], p[tails]
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.sqrt(-np.log(np.where(qt < 0, pt, 1.0 - pt)))
            near = r <= 5.0
            rn, rf = r - 1.6, r - 5.0
            x = np.where(near, np.polyval(_C, rn) / np.polyval(_D, rn), np.polyval(_E, rf) / np.polyval(_F, rf))
        x = np.where(r == np.inf, np.inf, x)
        out[tails] = np.where(qt < 0, -x, x)
    out[(p < 0) | (p > 1) | np.isnan(p)] = np.nan
    return out
