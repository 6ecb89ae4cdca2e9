"""The inverse Cholesky factor of a GP's kernel matrix, kept from one ask to the next (issue 34).

A search tells one point per ask and keeps the GP's hyperparameters for many asks between refits,
so the kernel matrix of an ask is the last one with rows and columns added. A leading block of a
Cholesky factor is the factor of the matrix's leading block, and the factor grows by blocks:

    K = [[K11, K12], [K21, K22]]  ->  L = [[L11, 0], [C^T, D]],   C = L11^-1 K12,
                                      D = chol(K22 - C^T C),
    L^-1 = [[L11^-1, 0], [-D^-1 C^T L11^-1, D^-1]].

:class:`GrowingFactor` keeps ``L^-1`` for the rows it last factored and the hyperparameters it was
built with. Asked again with the same hyperparameters, it keeps the leading block of the rows both
calls share (the told points; the pending points believed at the model's mean come after them and
change from ask to ask) and adds the rest: ``O(n^2 m)`` for ``m`` new rows instead of the ``O(n^3)``
of a new factor and its inverse. It is the same factor, to rounding: what an extension computes is
one step of a blocked Cholesky. New hyperparameters, or no shared rows, factor anew.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

#: Added to the diagonal of every factored matrix; raised tenfold (at most eight times) while the
#: factorisation fails, then 1e-2.
JITTER = 1e-9

Kernel = Callable[[np.ndarray, np.ndarray], np.ndarray]


class GrowingFactor:
    """``L^-1`` of ``kernel(x, x) + noise I`` for successive ``x`` that share leading rows."""

    def __init__(self) -> None:
        self.x = np.zeros((0, 0))
        self.inverse = np.zeros((0, 0))
        self.hyper: bytes | None = None
        self.jitter = JITTER
        #: Rows factored anew and rows added by extension, over this factor's life (for tests and
        #: benchmarks: what the reuse saved).
        self.rows_factored = 0
        self.rows_extended = 0

    def inverse_for(self, x: np.ndarray, kernel: Kernel, noise: float, hyper: bytes) -> np.ndarray:
        """``L^-1`` for the rows ``x`` under ``kernel`` and ``noise``; ``hyper`` identifies the
        hyperparameters (any change of them must change it)."""
        keep = self._shared_rows(x) if hyper == self.hyper else 0
        inverse = self._extend(x, keep, kernel, noise) if keep else None
        if inverse is None:
            inverse, self.jitter = self._factor(kernel(x, x), noise)
            self.rows_factored += len(x)
        else:
            self.rows_extended += len(x) - keep
        self.x, self.inverse, self.hyper = x, inverse, hyper
        return inverse

    def _shared_rows(self, x: np.ndarray) -> int:
        n = min(len(self.x), len(x))
        if n == 0 or self.x.shape[1] != x.shape[1]:
            return 0
        same = (self.x[:n] == x[:n]).all(axis=1)
        return n if same.all() else int(np.argmin(same))

    def _extend(self, x: np.ndarray, keep: int, kernel: Kernel, noise: float) -> np.ndarray | None:
        old = self.inverse[:keep, :keep]
        if keep == len(x):
            return old.copy()
        shared, new = x[:keep], x[keep:]
        c = old @ kernel(shared, new)
        schur = kernel(new, new) + (noise + self.jitter) * np.eye(len(new)) - c.T @ c
        try:
            d_inv = lower_inverse(np.linalg.cholesky(schur))
        except np.linalg.LinAlgError:
            return None  # the extension needs more jitter than the block it extends: factor anew
        out = np.zeros((len(x), len(x)))
        out[:keep, :keep] = old
        out[keep:, keep:] = d_inv
        out[keep:, :keep] = -d_inv @ (c.T @ old)
        return out

    @staticmethod
    def _factor(k: np.ndarray, noise: float) -> tuple[np.ndarray, float]:
        k = k + noise * np.eye(len(k))
        jitter = JITTER
        for _ in range(8):
            try:
                return lower_inverse(np.linalg.cholesky(k + jitter * np.eye(len(k)))), jitter
            except np.linalg.LinAlgError:
                jitter *= 10.0
        return lower_inverse(np.linalg.cholesky(k + 1e-2 * np.eye(len(k)))), 1e-2


def lower_inverse(lower: np.ndarray, block: int = 64) -> np.ndarray:
    """The inverse of a lower-triangular matrix (a Cholesky factor), by halves: the inverse of
    [[A, 0], [C, D]] is [[A^-1, 0], [-D^-1 C A^-1, D^-1]], down to blocks of ``block`` rows that
    numpy inverts. Two matrix products per level instead of a general LU inverse: about a sixth of
    numpy's ``inv`` time at 400 told points on one BLAS thread (issue 34), the same to rounding."""
    n = len(lower)
    if n <= block:
        return np.linalg.inv(lower)
    half = n // 2
    top = lower_inverse(lower[:half, :half], block)
    bottom = lower_inverse(lower[half:, half:], block)
    out = np.zeros_like(lower)
    out[:half, :half] = top
    out[half:, half:] = bottom
    out[half:, :half] = -bottom @ (lower[half:, :half] @ top)
    return out
