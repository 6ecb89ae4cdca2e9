"""The inverse Cholesky factor ``auto``'s GPs keep from one fit to the next: an extension gives
the factor a new factorisation gives, and the GP predicts the same through it. Seeded data, so
every assertion is deterministic."""

from __future__ import annotations

import numpy as np

from kernelforge.space import Space
from kernelforge.strategies.auto.factor import GrowingFactor, lower_inverse
from kernelforge.strategies.auto.surrogate import Encoder, GaussianProcess


def kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.exp(-((a[:, None] - b[None]) ** 2).sum(-1) / 4)


def fresh(x: np.ndarray, noise: float) -> np.ndarray:
    return lower_inverse(np.linalg.cholesky(kernel(x, x) + (noise + 1e-9) * np.eye(len(x))))


def test_lower_inverse_is_the_inverse_of_a_cholesky_factor():
    rng = np.random.default_rng(1)
    for n in (1, 5, 64, 65, 150, 400):  # below, at and above the block size, odd halves
        x = rng.normal(size=(n, 6))
        k = kernel(x, x) + 1e-3 * np.eye(n)
        lower = np.linalg.cholesky(k)
        inverse = lower_inverse(lower)
        assert np.allclose(inverse @ lower, np.eye(n), atol=1e-8)
        assert np.allclose(np.triu(inverse, 1), 0.0)  # lower-triangular, as the factor


def test_an_extended_factor_is_the_factor_of_the_grown_matrix():
    """The calls of a search: told points grow one by one, pending points are believed after
    them and replaced at the next ask; each result equals a new factorisation's."""
    rng = np.random.default_rng(2)
    told = rng.normal(size=(120, 5))
    noise = 1e-3
    factor = GrowingFactor()
    calls = [told[:100]]
    for n in range(101, 121):
        pending = rng.normal(size=(3, 5))
        calls += [told[:n], np.vstack([told[:n], pending])]
    for x in calls:
        inverse = factor.inverse_for(x, kernel, noise, b"same")
        assert np.allclose(inverse, fresh(x, noise), rtol=1e-7, atol=1e-7)
    assert factor.rows_factored == 100  # only the first call factored: every later one extended
    assert factor.rows_extended == 20 + 20 * 3


def test_new_hyperparameters_or_unrelated_rows_factor_anew():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(30, 4))
    factor = GrowingFactor()
    factor.inverse_for(x, kernel, 1e-3, b"a")
    inverse = factor.inverse_for(x, kernel, 1e-2, b"b")  # another key: another matrix
    assert np.allclose(inverse, fresh(x, 1e-2), rtol=1e-7, atol=1e-7)
    other = rng.normal(size=(30, 4))
    inverse = factor.inverse_for(other, kernel, 1e-2, b"b")  # no row shared
    assert np.allclose(inverse, fresh(other, 1e-2), rtol=1e-7, atol=1e-7)
    assert factor.rows_factored == 90 and factor.rows_extended == 0


def test_the_gp_predicts_the_same_through_an_extended_factor():
    space = Space.build({"a": list(range(16)), "b": list(range(16)), "c": [1, 2, 4, 8]}, [], where="test")
    encoder = Encoder(space)
    rng = np.random.default_rng(4)
    keys = [(int(a), int(b), int(c)) for a, b, c in zip(rng.integers(0, 16, 60), rng.integers(0, 16, 60),
                                                        rng.choice([1, 2, 4, 8], 60))]
    x = encoder.encode(keys)
    y = np.sin(x.sum(1)) + 0.1 * x[:, 0]
    kept = GaussianProcess(encoder)
    kept.fit(x[:40], y[:40], refit=True)
    for n in range(41, 61):
        kept.fit(x[:n], y[:n], refit=False)
    anew = GaussianProcess(encoder)
    anew.hyper = kept.hyper
    anew.fit(x, y, refit=False)
    assert kept.factor.rows_extended == 20
    probe = encoder.encode([(a, b, 4) for a in range(16) for b in range(0, 16, 3)])
    for got, want in zip(kept.predict(probe), anew.predict(probe)):
        assert np.allclose(got, want, rtol=1e-6, atol=1e-8)
