"""Fits ``ERF_NUMERATOR`` and ``ERF_DENOMINATOR`` of ``constants.py``: erf as
``x * P(x*x) / Q(x*x)`` on ``|x| <= ERF_CLAMP``, the form both runtimes evaluate on
MLX's CPU, where ``mx.erf`` costs ~90x a multiply and products and sums fuse under
``mx.compile``.

The fit is Sanathanan-Koerner's: weighted linear least squares of ``P - f Q`` over
Chebyshev nodes, reweighted by the last ``Q`` until it settles, on the relative error
of ``f(s) = erf(sqrt(s)) / sqrt(s)``. Prints the coefficients and the error of the
float32 evaluation against ``math.erf``.

    python serializer/fit_erf.py
"""

import math

import numpy as np

from etmlx.runtime_shim.mlx_ops.cpu_math import estrin
from etmlx.serializer.constants import ERF_CLAMP as CLAMP  # erf(3.92) rounds to 1 in float32

NUMERATOR_DEGREE, DENOMINATOR_DEGREE = 6, 5
NODES, ROUNDS = 4000, 30


def fit() -> tuple:
    nodes = np.arange(NODES)
    x = CLAMP * (1 - np.cos(np.pi * (nodes + 0.5) / NODES)) / 2
    s = x * x
    f = np.array([math.erf(v) for v in x]) / x
    weight = np.ones_like(f)
    powers_p = s[:, None] ** np.arange(NUMERATOR_DEGREE + 1)
    powers_q = s[:, None] ** np.arange(1, DENOMINATOR_DEGREE + 1)
    for _ in range(ROUNDS):
        system = np.hstack([powers_p, -f[:, None] * powers_q]) / (weight * f)[:, None]
        solution, *_ = np.linalg.lstsq(system, 1 / weight, rcond=None)
        numerator = solution[: NUMERATOR_DEGREE + 1]
        denominator = np.concatenate([[1.0], solution[NUMERATOR_DEGREE + 1 :]])
        weight = np.polyval(denominator[::-1], s)
    return tuple(numerator), tuple(denominator)


def erf_float32(x: np.ndarray, numerator, denominator) -> np.ndarray:
    """The runtimes' evaluation, in float32 (runtime_shim/mlx_ops/cpu_math.py)."""
    clamped = np.clip(x.astype(np.float32), np.float32(-CLAMP), np.float32(CLAMP))
    square = clamped * clamped
    p, q = (estrin([np.float32(c) for c in coefficients], square) for coefficients in (numerator, denominator))
    return np.clip(clamped * (p / q), np.float32(-1), np.float32(1))


def main() -> None:
    numerator, denominator = fit()
    print("ERF_NUMERATOR =", tuple(float(c) for c in numerator))
    print("ERF_DENOMINATOR =", tuple(float(c) for c in denominator))
    x = np.linspace(-6, 6, 1_200_001, dtype=np.float32)
    exact = np.array([math.erf(v) for v in x.astype(np.float64)])
    error = np.abs(erf_float32(x, numerator, denominator) - exact)
    ulps = error / np.spacing(np.abs(exact).astype(np.float32))
    print(f"float32: largest error {error.max():.2e}, {ulps.max():.1f} ulps")


if __name__ == "__main__":
    main()
