"""Transfer between recorded spaces: a run on one GPU's space starts from what another GPU recorded.

Times do not carry over between GPUs (another clock, memory, compiler), ranks do: the
configurations that were fastest on one GPU of a kernel are often among the fastest on another.
:func:`warm_points` ranks the source's successful configurations by time, the fastest first (one
group, so this is :func:`kernelforge.search.warm.rank`'s rule: time over the fastest, and a
configuration that failed there is left out), and keeps the first
:data:`~kernelforge.search.warm.DEFAULT_LIMIT` that are points of the target space (the target's
parameters, values and feasible set), the same number a search's ``--warm-start`` asks first.
The strategy bench (``--warm-from SPACE``) asks them before its strategy's own points, as a search
does: each costs an evaluation. Only the order is used, never a source time.
"""

from __future__ import annotations

from typing import Any

from kernelforge.errors import UserError
from kernelforge.search.warm import DEFAULT_LIMIT
from kernelforge.strategies.recorded import RecordedSpace


def same_kernel(source: RecordedSpace, target: RecordedSpace) -> bool:
    """Whether ``target`` is another recording of ``source``'s kernel: the same parameter names
    (in any order) and not the same space (the same name and device)."""
    same = (source.name, source.device) == (target.name, target.device)
    return not same and sorted(source.space.names) == sorted(target.space.names)


def warm_points(source: RecordedSpace, target: RecordedSpace, limit: int = DEFAULT_LIMIT) -> list[dict[str, Any]]:
    """The best-ranked configurations of ``source`` that are feasible points of ``target``, at most
    ``limit``, fastest first (see the module docstring). Raises UserError when ``target`` is not
    another recording of the same kernel (:func:`same_kernel`)."""
    if not same_kernel(source, target):
        raise UserError(f"--warm-from {source.name}: {target.name} is not another recording of its kernel (the "
                        f"same parameters, another space); warm-start a space from another GPU's recording")
    ranked = sorted((value, i, key) for i, (key, value) in enumerate(source.records.items()) if isinstance(value, float))
    names = source.space.names
    out: list[dict[str, Any]] = []
    for _, _, key in ranked:
        point = dict(zip(names, key))
        if target.key(point) in target.records:  # recorded there: a feasible point of the target
            out.append({name: point[name] for name in target.space.names})
            if len(out) == limit:
                break
    return out
