"""What experts actually ship for a block: the path a serving engine runs on Hopper, per preset family.

A speedup is only worth claiming against what people run. Each block declares, per family of its
presets (``Block.shipped``), the path vLLM or SGLang takes on an H100/H200 for those shapes, the
source it is read from (repository, file, revision), whether the block's Triton baseline is that
path (or a Triton kernel at least as strong at those shapes), and the library implementation that
would stand beside it with whether it can run on the GPU image and why not.

:func:`baseline_claim` is the one place that decides how a speedup over the baseline may be
labelled: "over experts" only when the baseline is the shipped path or as strong; otherwise it
names what it is over ("over a Triton fallback", say).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Shape(Protocol):
    """What this module reads of a shape (:class:`kernelforge.block.Shape`, which imports this
    module): its name and its dimensions by name."""

    name: str

    def get(self, key: str, default: Any = None) -> Any: ...


@dataclass(frozen=True)
class ShippedPath:
    """The shipped path of one preset family of a block.

    ``presets``: the shape-name prefix it covers (``deepseek-r1-tp8/``; ``*``: every shape not
    covered by another entry). ``engine``: who ships it (``vLLM``, ``SGLang``). ``path``: what runs,
    in that engine's words. ``source``: where it is read (repository, file and revision).
    ``baseline_is_expert``: whether the block's Triton baseline is that path or a Triton kernel at
    least as strong at these shapes; ``baseline_is``: what the baseline is, when it is not.
    ``library``: the implementation that would be timed as the library line; ``on_image``: whether
    it can run on the GPU image (Python 3.12, torch 2.11, Triton 3.6, carried wheels, no network);
    ``why_not``: why not, when it cannot. ``served``: False for a layout nobody serves (the report
    says so beside its numbers).
    """

    presets: str
    engine: str
    path: str
    source: str
    baseline_is_expert: bool
    library: str
    on_image: bool
    baseline_is: str = ""
    why_not: str = ""
    served: bool = True
    #: The token counts (the shape's ``T``, inclusive) this entry covers; None: every count.
    tokens: tuple[int, int] | None = None

    @property
    def library_status(self) -> str:
        """The library line's state in words, as the CLI and the report say it: whether it runs on
        the GPU image, and why not when it cannot."""
        return f"{self.library}: " + ("runs on the GPU image" if self.on_image else f"not on the GPU image: {self.why_not}")

    @property
    def summary(self) -> str:
        """Who runs what, from where, and the library line's state: the one sentence both report
        renderers print after the entry's presets."""
        return f"{self.engine} runs {self.path} ({self.source}). Library: {self.library_status}."

    def covers(self, shape: Shape) -> bool:
        """Whether this entry is the one for ``shape`` (its name prefix and token range)."""
        if self.presets != "*" and not shape.name.startswith(self.presets):
            return False
        return self.tokens is None or self.tokens[0] <= int(shape.get("T", -1)) <= self.tokens[1]


def shipped_for(paths: tuple[ShippedPath, ...], shape: Shape) -> ShippedPath | None:
    """The entry covering ``shape``: the first specific one, else the first ``*`` one."""
    covering = [p for p in paths if p.covers(shape)]
    specific = [p for p in covering if p.presets != "*"]
    return (specific or covering or [None])[0]


def covering(paths: tuple[ShippedPath, ...], shapes: "list[Shape] | tuple[Shape, ...]") -> tuple[ShippedPath, ...]:
    """The entries that are :func:`shipped_for` at least one of ``shapes``, in declared order."""
    chosen = {id(shipped_for(paths, shape)) for shape in shapes}
    return tuple(entry for entry in paths if id(entry) in chosen)


def baseline_claim(paths: tuple[ShippedPath, ...], shape: Shape) -> str:
    """How a speedup over the block's baseline on ``shape`` is labelled: ``over experts`` when
    the baseline is the shipped path (or as strong), else ``over <what the baseline is>``;
    ``over the Triton baseline`` when the block declares nothing for the shape."""
    entry = shipped_for(paths, shape)
    if entry is None:
        return "over the Triton baseline"
    label = "over experts" if entry.baseline_is_expert else f"over {entry.baseline_is or 'the Triton baseline'}"
    return label if entry.served else f"{label} (a layout nobody serves)"
