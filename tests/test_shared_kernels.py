"""Kernel text shared with templates (kernelforge.shared_kernels, issue 31): the MoE alignment kernel
every MoE template renders in, checked against a plain sort by expert, and the rendering rules (the
text is in every MoE candidate's source, no parameter may take a shared name)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelforge.catalog import Catalog
from kernelforge.errors import TemplateError
from kernelforge.candidate import load_module
from kernelforge.shared_kernels import SHARED, shared_values
from kernelforge.template import Template

REPO = Path(__file__).resolve().parents[1]
CATALOG = Catalog.discover(REPO / "kernels")
MOE_TEMPLATES = sorted(t.id for b in CATALOG.blocks if b.startswith("moe/") for t in CATALOG.templates(b))


def _align_module():
    text = "import torch\nimport triton\nimport triton.language as tl\n" + shared_values()["moe_align"]
    return load_module(text, "kf_test_moe_align")


def _expected(ids: torch.Tensor, experts: int, block_m: int):
    """The alignment by hand: each expert's slots in slot order, padded with the sentinel to a
    multiple of block_m; the expert of every tile; the padded length."""
    flat = ids.reshape(-1).tolist()
    rows, tiles = [], []
    for e in range(experts):
        mine = [s for s, x in enumerate(flat) if x == e]
        padded = -(-len(mine) // block_m) * block_m
        rows += mine + [len(flat)] * (padded - len(mine))
        tiles += [e] * (padded // block_m)
    return rows, tiles


@pytest.mark.interpreter
@pytest.mark.parametrize("T, topk, experts, block_m", [(1, 8, 384, 16), (7, 4, 16, 16), (33, 4, 16, 32),
                                                       (300, 8, 384, 64), (5, 1, 1, 16), (64, 4, 128, 128),
                                                       (40, 4, 8, 16)])
def test_moe_align_sorts_by_expert_in_slot_order_and_pads_per_expert(T, topk, experts, block_m):
    module = _align_module()
    gen = torch.Generator().manual_seed(T * 131 + experts)
    ids = torch.randint(0, experts, (T, topk), generator=gen, dtype=torch.int32)
    if T == 40:  # a skewed case: most slots on one expert, several experts empty
        ids[: 30] = 3
    sorted_ids, expert_ids, num_padded, rows_max = module.moe_align(ids, experts, block_m)
    rows, tiles = _expected(ids, experts, block_m)
    assert int(num_padded[0]) == len(rows) <= rows_max == T * topk + min(experts, T * topk) * (block_m - 1)
    assert sorted_ids[: len(rows)].tolist() == rows
    assert set(sorted_ids[len(rows):].tolist()) <= {T * topk}  # the rest is sentinel
    assert sorted_ids.numel() == -(-rows_max // block_m) * block_m
    assert expert_ids[: len(tiles)].tolist() == tiles
    assert set(expert_ids[len(tiles):].tolist()) <= {experts - 1}  # past the padded length: in range


@pytest.mark.parametrize("template_id", MOE_TEMPLATES)
def test_every_moe_template_renders_the_one_alignment_kernel(template_id):
    source = CATALOG.template(template_id).render_baseline()
    assert shared_values()["moe_align"] in source
    assert source.count("def moe_align(") == 1 and "def _align(" not in source
    assert "torch.argsort" not in source and "searchsorted" not in source  # no host-side alignment left


def test_a_parameter_may_not_take_a_shared_name():
    name = sorted(SHARED)[0]
    text = f'{{#-\n[template]\nrole = "variant"\n[space]\n{name} = [1, 2]\n[baseline]\n{name} = 1\n-#}}\n{{{{ {name} }}}}\n'
    with pytest.raises(TemplateError, match="shares with templates"):
        Template.from_text(text, template_id="toy/t", block_id="toy", where="t.py.j2")


def test_a_body_may_use_a_shared_name_without_declaring_it():
    text = '{#-\n[template]\nrole = "variant"\n[space]\nB = [1, 2]\n[baseline]\nB = 1\n-#}\nB = {{ B }}\n{{ moe_align }}\n'
    rendered = Template.from_text(text, template_id="toy/t", block_id="toy", where="t.py.j2").render({"B": 2})
    assert rendered == "B = 2\n" + shared_values()["moe_align"] + "\n"
