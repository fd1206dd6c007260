"""The throughput fit's Jacobian (service/analytics/throughput.fit): scipy's two-point finite difference
with its perturbed residuals evaluated in one array pass."""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import _numdiff


def finite_difference_jacobian(residuals_many: Any, x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """scipy's two-point finite-difference Jacobian of least_squares (jac="2-point": scipy.optimize._numdiff
    approx_derivative — its step, turned one-sided at the bounds, and J[:, i] = (f(x + h_i e_i) − f(x)) /
    ((x_i + h_i) − x_i)) with f(x) and the perturbed residuals from one residuals_many call: the same floats
    (its transposed layout too, which the solver's products read), one array pass instead of one call per
    parameter."""
    f0 = residuals_many(x[None, :])[0]
    h = _numdiff._compute_absolute_step(None, x, f0, "2-point")
    h, _ = _numdiff._adjust_scheme_to_bounds(x, h, 1, "1-sided", lo, hi)
    xs = np.tile(x, (len(x) + 1, 1))
    for i in range(len(x)):
        xs[i + 1, i] = x[i] + h[i]
    f = residuals_many(xs)
    dx = (x + h) - x
    jac_t = np.empty((len(x), len(f0)))
    for i in range(len(x)):
        jac_t[i] = (f[i + 1] - f[0]) / dx[i]
    return jac_t.T
