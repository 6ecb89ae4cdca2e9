"""Transfer between recorded spaces: a run on one GPU's space starts from what another GPU recorded.

Times do not carry over between GPUs (another clock, memory, compiler), ranks do: the
configurations that were fastest on one GPU of a kernel are often among the fastest on another.
:func:`warm_points` ranks the source's successful configurations by time, the fastest first (one
group, so this is :func:`kernelforge.search.warm.rank`'s rule: time over the fastest, and a
configuration that failed there is left out), keeps those that are points of the target space
(the target's parameters, values and feasible set), and takes :data:`DEFAULT_LIMIT` of them in
:func:`spread` order, the same number and order a search's ``--warm-start`` asks first
(:mod:`kernelforge.search.warm` reads both from here). The strategy bench (``--warm-from SPACE``)
asks them before its strategy's own points, as a search does: each costs an evaluation. Only the
order is used, never a source time.

Why spread: the few best configurations of a GPU are mostly one region, each one parameter from
the next (another block width, the same tiling). Where the target's fastest region is another of
the source's good ones, four points of one region buy one guess; points that differ pairwise in
at least :data:`APART` parameters buy several, and the one-parameter moves around the best of them
are what a model-guided search tries next anyway (``auto``'s local member). Measured with the
strategy bench on the shared convolution pair (reports/strategy-bench/README.md).

:func:`rank_scores` gives a model the whole order: each configuration's rank on the source as a
score in [0, 1] (the normal score of its rank, so the few best stand apart from the many middling:
0 for the fastest, 0.5 for the median, 1 for the slowest; a configuration that failed there
scores 1). ``auto`` reads it as one more input of its Gaussian processes
(:class:`~kernelforge.strategies.auto.surrogate.Encoder`), and the fit decides how much it says.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence, TypeVar

from kernelforge.errors import UserError
from kernelforge.strategies.bench.recorded import RecordedSpace

#: How many warm points a study, or a run of the strategy bench, asks first at most.
DEFAULT_LIMIT = 4
#: Warm points differ pairwise in at least this many parameters while the ranking offers such
#: points (:func:`spread`): one more than a local move.
APART = 2

T = TypeVar("T")


def spread(ranked: Iterable[T], limit: int, key: Callable[[T], Sequence[Any]] = lambda item: item,
           apart: int = APART) -> list[T]:
    """At most ``limit`` of ``ranked`` (best first): in rank order, each one whose ``key`` (its
    parameter values, in one order for all) differs from every one taken before in at least
    ``apart`` values; then, while fewer than ``limit`` are taken (a small space, a source that
    measured one region only), the best of the others in rank order."""
    items = list(ranked)
    keys = [tuple(key(item)) for item in items]
    taken: list[int] = []
    for i, k in enumerate(keys):
        if len(taken) == limit:
            break
        if all(sum(a != b for a, b in zip(k, keys[j])) >= apart for j in taken):
            taken.append(i)
    chosen = set(taken)
    taken += [i for i in range(len(items)) if i not in chosen][: max(0, limit - len(taken))]
    return [items[i] for i in taken]


def same_kernel(source: RecordedSpace, target: RecordedSpace) -> bool:
    """Whether ``target`` is another GPU's recording of ``source``'s kernel: the same parameter names
    (in any order), and another device where both name theirs (a recording on the same device, a
    copy under another file name included, would hand a run its own answers); where either names
    none, another name and other records."""
    if sorted(source.space.names) != sorted(target.space.names):
        return False
    if source.device and target.device:
        return source.device != target.device
    in_order = _in_order(source, target)
    return source.name != target.name and {in_order(k): v for k, v in source.records.items()} != dict(target.records)


def _in_order(source: RecordedSpace, target: RecordedSpace) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """A key of ``source`` (its values in its parameter order) to the same values in ``target``'s."""
    order = [source.space.names.index(name) for name in target.space.names]
    return lambda key: tuple(key[i] for i in order)


def other_recordings(source: RecordedSpace, spaces: Iterable[RecordedSpace], path: str) -> list[RecordedSpace]:
    """Those of ``spaces`` that are other recordings of ``source``'s kernel (:func:`same_kernel`), in
    order: the targets of ``--warm-from path``. Raises UserError when there is none."""
    targets = [space for space in spaces if same_kernel(source, space)]
    if not targets:
        on = f" on another device than {source.device}" if source.device else ""
        raise UserError(f"--warm-from {path}: no space to bench is another recording of its kernel{on} (the same "
                        f"parameters: {', '.join(source.space.names)}); give another GPU's cache of that kernel")
    return targets


def _require_same_kernel(source: RecordedSpace, target: RecordedSpace) -> None:
    if not same_kernel(source, target):
        raise UserError(f"--warm-from {source.name}: {target.name} is not another GPU's recording of its kernel (the "
                        f"same parameters, another device); warm-start a space from another GPU's recording")


def warm_points(source: RecordedSpace, target: RecordedSpace, limit: int = DEFAULT_LIMIT) -> list[dict[str, Any]]:
    """The best-ranked configurations of ``source`` that are feasible points of ``target``, at most
    ``limit``, in :func:`spread` order (see the module docstring). Raises UserError when ``target`` is not
    another recording of the same kernel (:func:`same_kernel`)."""
    _require_same_kernel(source, target)
    names = source.space.names
    feasible = []
    for key in _ranked(source):
        point = dict(zip(names, key))
        if target.key(point) in target.records:  # recorded there: a feasible point of the target
            feasible.append({name: point[name] for name in target.space.names})
    return spread(feasible, limit, key=lambda point: tuple(point.values()))


@dataclass(frozen=True)
class WarmStart:
    """What a run on one recorded space takes from another GPU's recording of its kernel: the points
    it asks first (:func:`warm_points`) and every configuration's rank score there
    (:func:`rank_scores`). The default is a cold start: no points, no scores."""

    first: tuple[dict[str, Any], ...] = ()
    transfer: Mapping[tuple[Any, ...], float] | None = None


def warm_start(source: RecordedSpace | None, target: RecordedSpace) -> WarmStart:
    """The warm start of a run on ``target`` from ``source`` (None: a cold start), the one rule the
    strategy bench and the development loop share. Raises UserError as :func:`warm_points` does."""
    if source is None:
        return WarmStart()
    return WarmStart(first=tuple(warm_points(source, target)), transfer=rank_scores(source, target))


def _ranked(source: RecordedSpace) -> list[tuple[Any, ...]]:
    """The keys of ``source``'s successful configurations, fastest first (ties: recorded first)."""
    return [key for _, _, key in sorted((value, i, key) for i, (key, value) in enumerate(source.records.items())
                                        if isinstance(value, float))]


def rank_scores(source: RecordedSpace, target: RecordedSpace) -> dict[tuple[Any, ...], float]:
    """Each configuration ``source`` recorded, keyed in ``target``'s parameter order, with its
    rank score (see the module docstring). Raises UserError as :func:`warm_points` does."""
    _require_same_kernel(source, target)
    in_order = _in_order(source, target)
    return scores_of([in_order(key) for key in _ranked(source)],
                     [in_order(key) for key, value in source.records.items() if not isinstance(value, float)])


def scores_of(ranked: Sequence[Hashable], failed: Iterable[Hashable] = ()) -> dict[Hashable, float]:
    """The rank score of each of ``ranked`` (fastest first) and 1.0 for each of ``failed``: the one
    rule of the module docstring, for a recorded space and for a search's stored results
    (:mod:`kernelforge.search.warm`)."""
    normal = NormalDist()
    edge = normal.inv_cdf(0.5 / len(ranked)) if len(ranked) > 1 else -1.0  # the fastest's normal score
    scores: dict[Hashable, float] = {}
    for rank, key in enumerate(ranked):
        z = normal.inv_cdf((rank + 0.5) / len(ranked))
        scores[key] = 0.5 - 0.5 * z / edge
    for key in failed:
        scores.setdefault(key, 1.0)
    return scores
