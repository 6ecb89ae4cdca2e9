"""The surrogate of the ``auto`` strategy: a Gaussian process over a discrete space, in numpy.

Points are encoded per parameter: a numeric parameter (ints and floats) as the rank of its value
among the sorted values, scaled to [0, 1]; any other parameter (strings, booleans, tuples) as a
one-hot block scaled so that two different values are at distance 1. A numeric parameter with at
least four values gets a one-hot block too: block sizes are often fast at powers of two and slow
between them (48, 80, 96 between 32, 64 and 128), which no smooth function of the rank fits. An
integer parameter with at least three values, some of them powers of two and some not, also gets a
column saying whether its value is a power of two: what 32, 64 and 128 share on a GPU (warps,
vector widths, aligned tiles), so a point at 128 learns from 32 before 128 is ever told. The
kernel is a Matérn 5/2 with one lengthscale per column group (automatic relevance determination:
a group that does not matter gets a long lengthscale, so the data decide whether a parameter acts
smoothly in rank, value by value, or both), fitted by maximising the log marginal likelihood with
Adam on the log-hyperparameters and its analytic gradient (no scipy).

Kernel-tuning spaces are small (a few thousand to a few hundred thousand points) and the history
short (tens to hundreds of evaluations), so an exact GP is cheap: a fit over 400 points takes a few
milliseconds; the hyperparameters are refitted on a bounded subsample (best and spread points), so
a refit stays cheap however long the search runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from kernelforge.space import Space, is_integer, is_number
from kernelforge.strategies.auto.factor import GrowingFactor, lower_inverse

SQRT5 = math.sqrt(5.0)


def is_numeric(values: Sequence[Any]) -> bool:
    """Whether a parameter's values are numbers (ints, floats; not booleans): ordered by rank."""
    return all(is_number(v) for v in values)


class Encoder:
    """Points of a space as feature rows; ``groups[g]`` lists the columns of group ``g``: one group
    per parameter (in order), then the value-by-value (one-hot) groups of numeric parameters with
    at least ``by_value`` values, then the power-of-two columns of integer parameters with at least
    ``power_of_two`` values of both kinds (``powers_of_two`` lists those parameters).
    ``initial_log_lengths`` starts the groups after the first ``len(space.params)`` long, so the
    smooth reading of the rank is the prior and the data must show the others.

    ``transfer`` (point key -> a score in [0, 1], 0 for the configuration that was fastest on
    another GPU: :func:`kernelforge.strategies.transfer.rank_scores`) adds one last column, a
    group of its own that starts as short as a parameter's: the model reads "ranked well there"
    as an input like any parameter and learns from the data how much it says here; a point
    without a score reads 0.5."""

    by_value = 4
    #: An integer parameter with at least this many values, some of them powers of two and some
    #: not, gets a power-of-two column.
    power_of_two = 3
    #: The starting log-lengthscale of the value-by-value and power-of-two groups (e: such a group
    #: first counts for little; the fit shortens it where the data show its effect).
    by_value_log_length = 1.0

    def __init__(self, space: Space, transfer: Mapping[tuple[Any, ...], float] | None = None):
        self.space = space
        self.transfer = dict(transfer) if transfer else None
        self.maps: list[dict[Any, np.ndarray]] = []
        self.groups: list[list[int]] = []
        column = 0
        onehot: list[int] = []
        for p, (_, values) in enumerate(space.params):
            if is_numeric(values) and len(values) > 1:
                order = sorted(values)
                scale = len(order) - 1
                self.maps.append({v: np.array([order.index(v) / scale]) for v in values})
                self.groups.append([column])
                column += 1
                if len(values) >= self.by_value:
                    onehot.append(p)
            else:
                width = len(values)
                eye = np.eye(width) / math.sqrt(2.0)
                self.maps.append({hashable(v): eye[i] for i, v in enumerate(values)})
                self.groups.append(list(range(column, column + width)))
                column += width
        #: (parameter index, value -> one-hot row) of every value-by-value group, in group order.
        self.by_values: list[tuple[int, dict[Any, np.ndarray]]] = []
        for p in onehot:
            values = space.params[p][1]
            eye = np.eye(len(values)) / math.sqrt(2.0)
            self.by_values.append((p, {v: eye[i] for i, v in enumerate(values)}))
            self.groups.append(list(range(column, column + len(values))))
            column += len(values)
        #: The integer parameters that also get a power-of-two column, in group order.
        self.powers_of_two = [p for p, (_, values) in enumerate(space.params)
                              if splits_by_power_of_two(values, self.power_of_two)]
        for _ in self.powers_of_two:
            self.groups.append([column])
            column += 1
        #: The group of the transfer column (None without one).
        self.transfer_group: int | None = None
        if self.transfer is not None:
            self.transfer_group = len(self.groups)
            self.groups.append([column])
            column += 1
        self.width = column

    def initial_log_lengths(self) -> np.ndarray:
        """The log-lengthscales a fit starts from: 0 per parameter, ``by_value_log_length`` for
        the value-by-value and power-of-two groups."""
        out = np.zeros(len(self.groups))
        out[len(self.maps):] = self.by_value_log_length
        if self.transfer_group is not None:
            out[self.transfer_group] = 0.0
        return out

    def encode(self, keys: Sequence[tuple[Any, ...]]) -> np.ndarray:
        """Rows of features for point keys (values in parameter order)."""
        out = np.empty((len(keys), self.width))
        for row, key in enumerate(keys):
            parts = [m[hashable(v)] for m, v in zip(self.maps, key)]
            parts.extend(m[key[p]] for p, m in self.by_values)
            parts.append(np.array([float(is_power_of_two(key[p])) for p in self.powers_of_two]))
            if self.transfer is not None:
                parts.append(np.array([self.transfer.get(tuple(key), 0.5)]))
            out[row] = np.concatenate(parts)
        return out


def is_power_of_two(value: Any) -> bool:
    """Whether ``value`` is a positive integer power of two (1, 2, 4, ...; not a boolean)."""
    return is_integer(value) and value > 0 and value & (value - 1) == 0


def splits_by_power_of_two(values: Sequence[Any], at_least: int = 3) -> bool:
    """Whether a parameter's values are integers, ``at_least`` of them, some powers of two and some
    not."""
    if len(values) < at_least or not all(is_integer(v) for v in values):
        return False
    flags = {is_power_of_two(v) for v in values}
    return flags == {True, False}


def hashable(value: Any) -> Any:
    """A parameter value usable as a dict key (a TOML list becomes a tuple)."""
    return tuple(value) if isinstance(value, list) else value


@dataclass
class Hyper:
    """Log-hyperparameters: one lengthscale per parameter, the signal and the noise variance."""

    log_lengths: np.ndarray
    log_signal: float = 0.0
    log_noise: float = math.log(1e-3)


class GaussianProcess:
    """An exact GP regression on standardised targets with a Matérn 5/2 ARD kernel.

    :meth:`fit` sets the data (and refits the hyperparameters when asked); :meth:`predict` gives
    the posterior mean and standard deviation; :meth:`correlation` the kernel between new and
    training points divided by the signal variance (0..1), used by the feasibility estimate.
    """

    min_log_length, max_log_length = math.log(0.05), math.log(20.0)
    min_log_noise, max_log_noise = math.log(1e-6), math.log(0.5)

    def __init__(self, encoder: Encoder):
        self.encoder = encoder
        self.groups = [np.array(g) for g in encoder.groups]
        self.hyper = Hyper(encoder.initial_log_lengths())
        self.x = np.zeros((0, encoder.width))
        self.mean = 0.0
        self.scale = 1.0
        self.alpha = np.zeros(0)
        self.chol_inv = np.zeros((0, 0))
        #: L^-1 of the kernel matrix, kept across fits with the same hyperparameters.
        self.factor = GrowingFactor()
        #: The hyperparameter fit under way (None: none), and the work all fits have spent.
        self.under_way: HyperFit | None = None
        self.work_done = 0.0
        #: The hyperparameter fits :meth:`update` started so far, and how many points start the next.
        self.refits = 0
        self.refit_at = 0

    # -- kernel -------------------------------------------------------------------------------

    def _column_scale(self, hyper: Hyper) -> np.ndarray:
        scale = np.empty(self.encoder.width)
        for group, log_length in zip(self.groups, hyper.log_lengths):
            scale[group] = math.exp(-log_length)
        return scale

    def _r(self, a: np.ndarray, b: np.ndarray, hyper: Hyper) -> np.ndarray:
        scale = self._column_scale(hyper)
        a, b = a * scale, b * scale
        sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
        return np.sqrt(np.maximum(sq, 0.0))

    @staticmethod
    def _matern(r: np.ndarray) -> np.ndarray:
        return (1.0 + SQRT5 * r + (5.0 / 3.0) * r * r) * np.exp(-SQRT5 * r)

    # -- fitting --------------------------------------------------------------------------------

    def update(self, x: np.ndarray, y: np.ndarray, *, first_steps: int, steps: int, subsample: int,
               rng: np.random.Generator, work: float | None) -> float:
        """:meth:`fit` on a schedule: the hyperparameters are refitted once the points have grown by
        an eighth (at least 2) since the last refit, ``first_steps`` Adam steps the first time and
        ``steps`` (from the last fit) after. Returns the work spent."""
        refit = len(y) >= self.refit_at
        if refit:
            self.refit_at = len(y) + max(2, len(y) // 8)
        first = self.refits == 0
        self.refits += refit
        return self.fit(x, y, refit=refit, steps=first_steps if first else steps, subsample=subsample, rng=rng,
                        work=work)

    def fit(self, x: np.ndarray, y: np.ndarray, *, refit: bool, steps: int = 40, subsample: int = 120,
            rng: np.random.Generator | None = None, work: float | None = None) -> float:
        """Condition on ``x`` (rows) and ``y``; with ``refit``, first start a fit of the
        hyperparameters on at most ``subsample`` of the points (the best third and a spread of the
        rest), ``steps`` Adam steps from the current ones. ``work`` bounds what this call spends on
        a fit under way (:class:`HyperFit`, in steps on ``subsample`` points; None: finish it): a
        fit left unfinished goes on at the next call, and until it ends the model conditions on
        the last finished fit's hyperparameters. Returns the work spent."""
        self.mean = float(y.mean())
        self.scale = float(y.std()) or 1.0
        z = (y - self.mean) / self.scale
        if refit and len(y) >= 3:
            index = np.arange(len(y))
            if len(y) > subsample:
                order = np.argsort(z)
                best = order[: subsample // 3]
                rest = (rng or np.random.default_rng(0)).choice(order[subsample // 3:], subsample - len(best),
                                                                replace=False)
                index = np.concatenate([best, rest])
            start = self.hyper if self.under_way is None else self.under_way.hyper()
            self.under_way = HyperFit(self, x[index], z[index], start, steps, unit=subsample)
        spent = 0.0
        if self.under_way is not None and (work is None or work > 0):
            spent = self.under_way.advance(work)
            self.work_done += spent
            if self.under_way.done:
                self.hyper = self.under_way.hyper()
                self.under_way = None
        self.x = x
        hyper = self.hyper
        key = np.concatenate([hyper.log_lengths, [hyper.log_signal, hyper.log_noise]]).tobytes()
        self.chol_inv = self.factor.inverse_for(x, self.hyper_kernel, math.exp(hyper.log_noise), key)
        self.alpha = self.chol_inv.T @ (self.chol_inv @ z)
        return spent

    def hyper_kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return math.exp(self.hyper.log_signal) * self._matern(self._r(a, b, self.hyper))

    # -- prediction -----------------------------------------------------------------------------

    def predict_mean(self, x: np.ndarray) -> np.ndarray:
        """The posterior mean alone (on the scale of the fitted ``y``): a fraction of the cost of
        :meth:`predict` over many points, whose standard deviation costs a product with L^-1."""
        return self.mean + self.scale * (self.hyper_kernel(x, self.x) @ self.alpha)

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation (on the scale of the fitted ``y``)."""
        ks = self.hyper_kernel(x, self.x)
        mu = ks @ self.alpha
        vs = self.chol_inv @ ks.T
        var = math.exp(self.hyper.log_signal) - (vs * vs).sum(0)
        sd = np.sqrt(np.maximum(var, 1e-12))
        return self.mean + self.scale * mu, self.scale * sd

    def correlation(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The kernel's correlation (0..1) between rows of ``a`` and ``b``."""
        return self._matern(self._r(a, b, self.hyper))


class HyperFit:
    """Adam on the log marginal likelihood of ``gp`` over ``x``, ``z``, from ``start``, for
    ``steps`` steps, taken a few at a time (:meth:`advance`). A step costs ``(len(z) / unit) ** 3``
    of work (a step's Cholesky factor and inverse grow with the cube of the points): a step on
    ``unit`` points costs 1, so the first fit of a short history costs almost nothing and a bound
    on the work of one ask (``AutoStrategy.ask_work``) splits only the fits that take time."""

    lr, b1, b2 = 0.08, 0.9, 0.999

    def __init__(self, gp: GaussianProcess, x: np.ndarray, z: np.ndarray, start: Hyper, steps: int, *,
                 unit: int = 80):
        n = len(z)
        self.gp, self.z, self.steps, self.step = gp, z, steps, 0
        self.cost = min(1.0, (n / max(unit, 1)) ** 3)
        groups = gp.groups
        # Per-group squared distances (training set only), stacked (groups, n, n): every step's
        # distances and gradient are then one contraction over the groups, not a loop of them.
        dsq = np.empty((len(groups), n, n))
        for g, group in enumerate(groups):
            diff = x[:, None, group] - x[None, :, group]
            dsq[g] = (diff * diff).sum(-1)
        self.flat = dsq.reshape(len(groups), n * n)
        self.theta = np.concatenate([start.log_lengths, [start.log_signal, start.log_noise]])
        self.lo = np.concatenate([np.full(len(groups), gp.min_log_length), [math.log(0.05), gp.min_log_noise]])
        self.hi = np.concatenate([np.full(len(groups), gp.max_log_length), [math.log(20.0), gp.max_log_noise]])
        self.m, self.v = np.zeros_like(self.theta), np.zeros_like(self.theta)

    @property
    def done(self) -> bool:
        return self.step >= self.steps

    def hyper(self) -> Hyper:
        g = len(self.gp.groups)
        return Hyper(self.theta[:g].copy(), float(self.theta[-2]), float(self.theta[-1]))

    def advance(self, work: float | None = None) -> float:
        """Take the steps left, as many as ``work`` pays for (None: all); returns the work spent."""
        spent = 0.0
        while not self.done and (work is None or spent + self.cost <= work + 1e-12):
            self._one_step()
            spent += self.cost
        return spent

    def _one_step(self) -> None:
        self.step += 1
        n, g, theta, z, flat = len(self.z), len(self.gp.groups), self.theta, self.z, self.flat
        lengths2 = np.exp(-2.0 * theta[:g])
        rsq = (lengths2 @ flat).reshape(n, n)
        r = np.sqrt(np.maximum(rsq, 0.0))
        signal, noise = math.exp(theta[-2]), math.exp(theta[-1])
        base = np.exp(-SQRT5 * r)
        k = signal * (1.0 + SQRT5 * r + (5.0 / 3.0) * rsq) * base
        ky = k + noise * np.eye(n)
        try:
            chol = np.linalg.cholesky(ky)
        except np.linalg.LinAlgError:
            theta[-1] = min(theta[-1] + 1.0, self.hi[-1])
            return
        chol_inv = lower_inverse(chol)
        inv = chol_inv.T @ chol_inv
        alpha = inv @ z
        w = np.outer(alpha, alpha) - inv  # d logL / dK = 0.5 * w
        grad = np.empty_like(theta)
        dk_common = signal * (5.0 / 3.0) * (1.0 + SQRT5 * r) * base
        grad[:g] = 0.5 * lengths2 * (flat @ (w * dk_common).ravel())
        grad[-2] = 0.5 * np.sum(w * k)
        grad[-1] = 0.5 * noise * np.trace(w)
        # Ascend the likelihood, with a weak pull of the lengthscales towards 1 (a prior).
        grad[:g] -= 0.05 * theta[:g]
        self.m = self.b1 * self.m + (1 - self.b1) * grad
        self.v = self.b2 * self.v + (1 - self.b2) * grad * grad
        step = self.step
        theta = theta + self.lr * (self.m / (1 - self.b1 ** step)) / (np.sqrt(self.v / (1 - self.b2 ** step)) + 1e-8)
        self.theta = np.clip(theta, self.lo, self.hi)


def expected_improvement(mu: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """Expected improvement below ``best`` (minimisation) of normal predictions."""
    z = (best - mu) / sd
    cdf = 0.5 * (1.0 + _erf(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return (best - mu) * cdf + sd * pdf


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7): numpy has no erf.
    sign = np.sign(x)
    x = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-x * x))
