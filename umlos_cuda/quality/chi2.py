"""The chi-square survival function, without SciPy.

The quality report's independence test needs one number SciPy would give as
``scipy.stats.chi2.sf(x, dof)``; SciPy is not a dependency of umlos-cuda, so
this module computes it from the regularized upper incomplete gamma function
``Q(a, x)`` (``chi2.sf(x, k) = Q(k / 2, x / 2)``) by its power series below
``x = a + 1`` and its continued fraction (modified Lentz) above, the two
classic evaluations (Numerical Recipes §6.2). Both converge to double
precision in at most a few thousand terms for the degrees of freedom the
report uses (``(K - 1)^2`` for at most :data:`MAX_DOF`); a p-value below
about 1e-308 underflows to 0.0, which the report prints as such.
"""

from __future__ import annotations

import math

from .. import checks, errors
from ..errors import QUALITY_OPERATOR as OPERATOR, UmlosError

#: Relative precision the expansions stop at.
_EPSILON = 1e-15
#: Guard against a division by zero in the continued fraction.
_TINY = 1e-300
#: Terms tried before giving up (never reached for dof <= MAX_DOF).
_MAX_TERMS = 100_000
#: Largest dof accepted: (K - 1)^2 for K = 1024 buckets.
MAX_DOF = 1023 * 1023


def chi2_sf(statistic: float, dof: int) -> float:
    """``P(X >= statistic)`` for ``X`` chi-square distributed with ``dof`` degrees of freedom."""
    dof = checks.integer(dof, "dof", 1, MAX_DOF, fail=checks.raising(errors.INVALID_ARGUMENT, operator=OPERATOR),
                         message="{name} must be an integer in [{low}, {high}], got {value!r}")
    statistic = float(statistic)
    if math.isnan(statistic):
        raise UmlosError(errors.INVALID_ARGUMENT, "the chi-square statistic is NaN", operator=OPERATOR)
    if statistic <= 0.0:
        return 1.0
    return regularized_gamma_q(dof / 2.0, statistic / 2.0)


def regularized_gamma_q(a: float, x: float) -> float:
    """``Q(a, x) = Γ(a, x) / Γ(a)`` for ``a > 0``, ``x >= 0``."""
    if x <= 0.0:
        return 1.0
    if math.isinf(x):
        return 0.0
    if x < a + 1.0:
        return max(0.0, 1.0 - _lower_series(a, x))
    return _upper_fraction(a, x)


def _prefactor(a: float, x: float) -> float:
    """``x^a e^-x / Γ(a)``, through logarithms so that large ``a`` and ``x`` do not overflow."""
    return math.exp(a * math.log(x) - x - math.lgamma(a))


def _lower_series(a: float, x: float) -> float:
    """``P(a, x) = x^a e^-x / Γ(a) · Σ_n x^n / (a (a+1) ... (a+n))``."""
    term = total = 1.0 / a
    denominator = a
    for _ in range(_MAX_TERMS):
        denominator += 1.0
        term *= x / denominator
        total += term
        if abs(term) < abs(total) * _EPSILON:
            return total * _prefactor(a, x)
    raise _not_converged(a, x)


def _upper_fraction(a: float, x: float) -> float:
    """``Q(a, x)`` by the continued fraction ``1 / (x + 1 - a - 1·(1 - a) / (x + 3 - a - ...))``."""
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    h = d
    for i in range(1, _MAX_TERMS):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = _TINY if abs(d) < _TINY else d
        c = b + an / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPSILON:
            return h * _prefactor(a, x)
    raise _not_converged(a, x)


def _not_converged(a: float, x: float) -> UmlosError:
    return UmlosError(errors.INVALID_ARGUMENT, f"the incomplete gamma function did not converge at a={a}, x={x}",
                      operator=OPERATOR)
