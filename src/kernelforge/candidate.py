"""Candidates: one concrete kernel source, a template rendered at one point of its space.

A candidate's id is the hash of its template's id and its rendered text (:func:`candidate_id`), so
two points of one template that render the same source are the same candidate, two templates that
render the same text are not (a generated template's id is the hash of its whole text, header
included), and any stored result can be reproduced from the stored source alone.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping

from kernelforge.template import Template

ORIGINS = ("baseline", "auto", "optuna", "grid", "llm", "manual")


def source_id(source: str) -> str:
    """The content id of a kernel source (first 16 hex digits of its SHA-256)."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]


def candidate_id(template_id: str, source: str) -> str:
    """The id of the candidate of ``template_id`` whose rendered text is ``source``: both hashed
    together, so what makes two templates different (their ids) makes their candidates different,
    and the same template rendering the same text (a resumed search) finds its stored candidate."""
    return source_id(f"{template_id}\n{source}")


@dataclass(frozen=True)
class Candidate:
    """A rendered kernel: where it came from and its full source."""

    block_id: str
    template_id: str
    params: tuple[tuple[str, Any], ...]
    source: str
    origin: str = "manual"
    parent: str | None = None

    @classmethod
    def from_template(
        cls, template: Template, point: Mapping[str, Any] | None = None, *, origin: str | None = None,
        parent: str | None = None,
    ) -> "Candidate":
        """Render ``template`` at ``point`` (its baseline point when omitted)."""
        is_baseline = point is None or dict(point) == dict(template.baseline)
        point = dict(template.baseline if point is None else point)
        if origin is None:
            origin = "baseline" if is_baseline and template.role == "baseline" else "manual"
        return cls(
            block_id=template.block_id,
            template_id=template.id,
            params=tuple((name, point[name]) for name in template.space.names),
            source=template.render(point),
            origin=origin,
            parent=parent,
        )

    @property
    def id(self) -> str:
        return candidate_id(self.template_id, self.source)

    @property
    def point(self) -> dict[str, Any]:
        return dict(self.params)

    def describe(self) -> str:
        params = " ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.template_id} [{params}]"


def module_dir() -> Path:
    """Where rendered sources are written so Triton can read them back (it needs a real file for
    ``inspect.getsource``). ``KERNELFORGE_CACHE`` overrides the default under the temp folder."""
    root = os.environ.get("KERNELFORGE_CACHE") or os.path.join(tempfile.gettempdir(), "kernelforge")
    path = Path(root) / "candidates"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_module(source: str, name_hint: str = "candidate") -> ModuleType:
    """Import a rendered source as a fresh module (never one cached from an earlier import).

    The interpreter flag (TRITON_INTERPRET) is read when ``@triton.jit`` runs, i.e. here: the
    device must be prepared before any candidate is loaded.
    """
    digest = source_id(source)
    path = module_dir() / f"kf_{digest}.py"
    if not path.exists() or path.read_text(encoding="utf-8") != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source, encoding="utf-8")
        os.replace(tmp, path)
    module_name = f"kernelforge_candidate_{name_hint.replace('/', '_')}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # Triton resolves globals of jitted functions via the module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module
