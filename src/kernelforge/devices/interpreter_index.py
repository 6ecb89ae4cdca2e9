"""A second interpreter fix: scalars read from memory used as Python integers (Triton <= 3.6 with
NumPy >= 2.4).

In the interpreter a scalar loaded from memory (``end = tl.load(lengths + b)``) is a one-element
numpy array of shape ``(1,)``. ``range(start, end, BLOCK)`` and indexing call its ``__index__``,
which Triton 3.6 defines as ``int(self.handle.data)``. NumPy 2.4 removed the conversion of arrays
with a dimension to Python scalars, so every kernel whose loop bound is read from memory (ragged
decode, the MoE experts' token ranges, the norm's row loop) raises ``TypeError: only 0-dimensional
arrays can be converted to Python scalars`` there, and nothing of it happens on a GPU. Triton 3.9
squeezes the array first; this patch makes 3.6 do the same, which is all the GPU image's Triton
needs to run the shipped kernels in the interpreter (the CI leg of issue 28).

:func:`patch_scalar_index` decides from behaviour, not a version string: it asks Triton's own
``_patch_lang_tensor`` for the ``__index__`` it would install and tries it on a ``(1,)`` array;
only when that fails does it wrap ``_patch_lang_tensor`` to install a squeezing ``__index__``
after Triton's own. It never raises, and an interpreter without these internals is left alone.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

_MARK = "_kernelforge_scalar_index"


def _squeezed_index(self: Any) -> int:
    return int(np.asarray(self.handle.data).reshape(-1)[0]) if np.size(self.handle.data) == 1 \
        else int(self.handle.data)


class _Recorder:
    """A stand-in for the interpreter's patch scope that keeps what would be set."""

    def __init__(self) -> None:
        self.attrs: dict[str, Any] = {}

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        self.attrs[name] = value


def _installed_index(patch_tensor: Callable) -> Callable | None:
    recorder = _Recorder()
    try:
        patch_tensor(type("probe", (), {}), recorder)
    except Exception:  # noqa: BLE001 - unknown internals: leave the interpreter alone
        return None
    return recorder.attrs.get("__index__")


def needs_scalar_index_fix(patch_tensor: Callable) -> bool:
    """Whether the ``__index__`` that ``patch_tensor`` installs fails on a one-element array."""
    index = _installed_index(patch_tensor)
    if index is None:
        return False
    try:
        return index(SimpleNamespace(handle=SimpleNamespace(data=np.array([3], dtype=np.int32)))) != 3
    except TypeError:
        return True


def patch_scalar_index() -> bool:
    """Install the squeezing ``__index__`` where the interpreter needs it; whether it is in place."""
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    original = getattr(interp, "_patch_lang_tensor", None)
    if original is None:
        return False
    if getattr(original, _MARK, False):
        return True
    if not needs_scalar_index_fix(original):
        return False

    def patched(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", _squeezed_index)

    setattr(patched, _MARK, True)
    interp._patch_lang_tensor = patched
    return True
