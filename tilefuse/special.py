"""SciPy's special functions that the references use, with SciPy imported on first use:
``import tilefuse`` does not load SciPy (~0.15 s); the first erf or sigmoid computed does."""

from __future__ import annotations

import numpy as np


def erf(x: np.ndarray) -> np.ndarray:
    """``scipy.special.erf``."""
    import scipy.special

    return scipy.special.erf(x)


def expit(x: np.ndarray) -> np.ndarray:
    """``scipy.special.expit``, the logistic sigmoid 1/(1+exp(-x))."""
    import scipy.special

    return scipy.special.expit(x)


__all__ = ["erf", "expit"]
