"""Per-shape baselines (kernelforge.baselines, Template.baseline_for): FlashAttention-2's split
heuristic on hand-worked cases, every parse error of a [[baselines]] rule, and the resolution
rules (first matching rule, nearest key with ties to the smaller key, when, computed, fallback)."""

from __future__ import annotations

import pytest

from kernelforge.baselines import (DEFAULT_SOURCE, FUNCTIONS, BaselinePoint, cdiv, flash_attn_num_splits, liger_num_warps,
                                   next_power_of_2)
from kernelforge.block import Shape
from kernelforge.errors import TemplateError
from kernelforge.search.study import start_points
from kernelforge.strategies.names import make_strategy
from kernelforge.template import Template

HEAD = """{{#-
[template]
role = "{role}"
{extra}
[space]
BLOCK = [16, 32, 64, 128]
num_warps = [1, 2, 4]

[baseline]
BLOCK = 64
num_warps = 4
{rules}
-#}}
{{{{ BLOCK }}}} {{{{ num_warps }}}}
"""


def template(rules: str = "", extra: str = "", role: str = "baseline") -> Template:
    text = HEAD.format(rules=rules, extra=extra, role=role)
    return Template.from_text(text, template_id="toy/t", block_id="toy", where="t.py.j2")


def n(value: int, **more) -> Shape:
    return Shape.of(f"n{value}", N=value, **more)


# -- FlashAttention-2's num_splits_heuristic ------------------------------------------------------


def test_num_splits_hand_worked_48_heads_on_108_sms_is_two():
    # s=1: 48/108 = 0.44 waves (eff 0.44); s=2: 0.89 (eff 0.89); ...; s=9: 4.0 waves (eff 1.0).
    # Best 1.0, so the smallest eligible s with eff >= 0.85 is 2.
    assert flash_attn_num_splits(48, 108, 64, 128) == 2


def test_num_splits_is_one_when_the_grid_almost_fills_the_sms():
    assert flash_attn_num_splits(87, 108, 64, 128) == 1  # 87 >= 0.8 * 108 = 86.4
    assert flash_attn_num_splits(200, 132, 1000, 128) == 1


def test_num_splits_just_below_the_threshold_splits():
    # 86 < 86.4: s=1..4 all give 0.796 efficiency; s=5: 430/108 = 3.98 waves, eff 0.995 >= 0.85 * best.
    assert flash_attn_num_splits(86, 108, 64, 128) == 5


def test_num_splits_skips_ineligible_split_counts():
    # 8 heads on 132 SMs, 64 key blocks: s=13 (eff 0.79) is below 0.85; s=14 and 15 give
    # cdiv(64, s) = 5 like s=13, so they are not eligible; s=16 (4 blocks each, eff 0.97) is chosen.
    assert flash_attn_num_splits(8, 132, 64, 128) == 16


def test_num_splits_is_capped_by_the_key_blocks_and_max_splits():
    assert flash_attn_num_splits(1, 132, 1, 128) == 1
    assert flash_attn_num_splits(1, 132, 3, 128) == 3  # efficiency grows with s up to the 3 blocks
    assert flash_attn_num_splits(1, 132, 64, 4) == 4


def test_functions_table():
    assert set(FUNCTIONS) == {"cdiv", "min", "max", "flash_attn_num_splits", "next_power_of_2", "liger_num_warps"}
    assert cdiv(7, 2) == 4 and cdiv(8, 2) == 4 and cdiv(1, 256) == 1
    assert [next_power_of_2(n) for n in (0, 1, 2, 3, 2880, 4096, 7168)] == [1, 1, 2, 4, 4096, 4096, 8192]
    assert [liger_num_warps(b) for b in (1024, 2048, 4096, 8192, 32768)] == [4, 8, 8, 16, 32]


# -- parsing ----------------------------------------------------------------------------------


@pytest.mark.parametrize("rules, expected", [
    ('[[baselines]]\npoint = { BLOCK = 16 }', r"\[\[baselines\]\]\[0\] source: missing"),
    ('[[baselines]]\nsource = ""\npoint = { BLOCK = 16 }', r"\[0\] source: must be a non-empty string"),
    ('[[baselines]]\nsource = "s"\npoint = { BLOCK = 16 }\ncolour = "red"', r"unknown field\(s\) colour"),
    ('[[baselines]]\nsource = "s"', r"\[0\]: sets nothing; give point, nearest with points, or computed"),
    ('[[baselines]]\nsource = "s"\npoint = { BLOCK = 16 }\nnearest = "N"\npoints = { "1" = { BLOCK = 16 } }',
     r"either point or nearest with points, not both"),
    ('[[baselines]]\nsource = "s"\npoints = { "1" = { BLOCK = 16 } }', r"\[0\] nearest: missing"),
    ('[[baselines]]\nsource = "s"\nnearest = "N"', r"\[0\] points: missing"),
    ('[[baselines]]\nsource = "s"\nnearest = "N"\npoints = { "one" = { BLOCK = 16 } }',
     r"points: key 'one' is not an integer"),
    ('[[baselines]]\nsource = "s"\nnearest = "N + 1"\npoints = { "1" = { BLOCK = 16 } }',
     r"nearest: 'N \+ 1' is not a dimension name"),
    ('[[baselines]]\nsource = "s"\nnearest = "N"\npoints = { "1" = { BLOCK = 48 } }',
     r"points\.1: BLOCK=48 is not one of \[16, 32, 64, 128\]"),
    ('[[baselines]]\nsource = "s"\npoint = { BLOK = 16 }', r"point: unknown parameter 'BLOK'"),
    ('[[baselines]]\nsource = "s"\npoint = 16', r"point: must be a table"),
    ('[[baselines]]\nsource = "s"\nwhen = "N >"\npoint = { BLOCK = 16 }', r"\[0\] when:.*not a valid expression"),
    ('[[baselines]]\nsource = "s"\nwhen = "__import__(\'os\')"\npoint = { BLOCK = 16 }',
     r"when.*may only call cdiv, min, max, flash_attn_num_splits, next_power_of_2 or liger_num_warps"),
    ('[[baselines]]\nsource = "s"\nwhen = "N.real"\npoint = { BLOCK = 16 }', r"uses Attribute, which is not allowed"),
    ('[[baselines]]\nsource = "s"\ncomputed = { WARPS = "1" }', r"computed: unknown parameter 'WARPS'"),
    ('[[baselines]]\nsource = "s"\ncomputed = { num_warps = 4 }', r"computed num_warps: must be a non-empty string"),
    ('[[baselines]]\nsource = "s"\ncomputed = { num_warps = "max(1," }', r"computed num_warps.*not a valid"),
    ('[[baselines]]\nsource = "s"\ncomputed = {}', r"computed: must be a table of parameter"),
    ('[[baselines]]\nsource = "s"\npoint = { BLOCK = 16 }\n[[baselines]]\npoint = { BLOCK = 32 }',
     r"\[\[baselines\]\]\[1\] source: missing"),
])
def test_each_bad_rule_field_is_named(rules, expected):
    with pytest.raises(TemplateError, match=expected) as info:
        template(rules)
    assert str(info.value).startswith("t.py.j2")


def test_a_rule_point_outside_the_constraints_is_refused_at_parse_time():
    text = HEAD.format(rules='[[baselines]]\nsource = "s"\npoint = { BLOCK = 128, num_warps = 1 }', extra="",
                       role="baseline")
    text = text.replace('role = "baseline"', 'role = "baseline"\nconstraints = ["BLOCK <= 64 or num_warps >= 2"]')
    with pytest.raises(TemplateError, match=r"\[0\]: its point .* violates constraint"):
        Template.from_text(text, template_id="toy/t", block_id="toy", where="t.py.j2")


def test_baselines_must_be_an_array_of_tables():
    with pytest.raises(TemplateError, match=r"\[\[baselines\]\]: must be an array of tables"):
        template('[baselines]\nsource = "s"')


def test_rules_belong_to_the_baseline_template_only():
    with pytest.raises(TemplateError, match=r'only a role = "baseline" template'):
        template('[[baselines]]\nsource = "s"\npoint = { BLOCK = 16 }', role="variant")


def test_baseline_source_must_be_a_non_empty_string():
    with pytest.raises(TemplateError, match=r"\[template\] baseline_source: must be a non-empty string"):
        template(extra="baseline_source = 3")


# -- resolution -------------------------------------------------------------------------------


TABLE = """
[[baselines]]
source = "tuned table"
when = "N <= 100"
nearest = "N"
points = { "64" = { BLOCK = 128 }, "1" = { BLOCK = 16, num_warps = 1 }, "3" = { BLOCK = 32 } }

[[baselines]]
source = "heuristic"
when = "N > 1000"
point = { BLOCK = 128 }
computed = { num_warps = "min(4, cdiv(N, 1000))" }

[[baselines]]
source = "catch-all for N > 100"
point = { num_warps = 2 }
"""


def test_a_template_without_rules_gives_its_baseline_everywhere():
    t = template()
    assert t.baseline_rules == () and t.baseline_source == DEFAULT_SOURCE
    assert t.baseline_for(n(5)) == BaselinePoint({"BLOCK": 64, "num_warps": 4}, DEFAULT_SOURCE, None)


def test_nearest_key_with_ties_to_the_smaller_key():
    t = template(TABLE)
    assert [r.index for r in t.baseline_rules] == [0, 1, 2]
    assert list(t.baseline_rules[0].points) == [1, 3, 64]  # keys sorted ascending
    got = {v: t.baseline_for(n(v)) for v in (1, 2, 3, 33, 34, 35, 100)}
    assert got[1].point == {"BLOCK": 16, "num_warps": 1}  # exact key; num_warps from the entry
    assert got[2].point == {"BLOCK": 16, "num_warps": 1}  # 2 is as near to 1 as to 3: the smaller key
    assert got[3].point == {"BLOCK": 32, "num_warps": 4}  # num_warps left out: [baseline]'s
    assert got[33].point["BLOCK"] == 32 and got[34].point["BLOCK"] == 128  # 33.5 is the midpoint
    assert got[35].point["BLOCK"] == 128 and got[100].point["BLOCK"] == 128
    assert {p.source for p in got.values()} == {"tuned table"} and {p.rule for p in got.values()} == {0}


def test_the_first_rule_whose_when_holds_wins_and_computed_is_evaluated():
    t = template(TABLE)
    assert t.baseline_for(n(1500)) == BaselinePoint({"BLOCK": 128, "num_warps": 2}, "heuristic", 1)
    assert t.baseline_for(n(99999)).point == {"BLOCK": 128, "num_warps": 4}  # min(4, 100)
    # N = 500: neither of the first two; the third has no when: it always applies.
    assert t.baseline_for(n(500)) == BaselinePoint({"BLOCK": 64, "num_warps": 2}, "catch-all for N > 100", 2)


def test_no_matching_rule_falls_back_to_the_baseline_and_its_source():
    t = template('[[baselines]]\nsource = "s"\nwhen = "N == 7"\npoint = { BLOCK = 16 }',
                 extra='baseline_source = "vLLM get_default_config"')
    assert t.baseline_for(n(8)) == BaselinePoint({"BLOCK": 64, "num_warps": 4}, "vLLM get_default_config", None)
    assert t.baseline_for(n(7)).point == {"BLOCK": 16, "num_warps": 4}


def test_computed_can_call_the_flash_attention_heuristic():
    t = template('[[baselines]]\nsource = "FA2"\ncomputed = { num_warps = '
                 '"min(4, flash_attn_num_splits(B * H, 108, cdiv(N, 64), 128))" }')
    assert t.baseline_for(n(4096, B=1, H=48)).point["num_warps"] == 2  # the hand-worked case: 2 splits
    assert t.baseline_for(n(4096, B=2, H=48)).point["num_warps"] == 1  # 96 >= 86.4


def test_a_computed_value_outside_the_space_names_the_rule_and_the_shape():
    t = template('[[baselines]]\nsource = "s"\ncomputed = { num_warps = "cdiv(N, 100)" }')
    assert t.baseline_for(n(150)).point["num_warps"] == 2
    with pytest.raises(TemplateError, match=r"\[\[baselines\]\]\[0\]: on shape n250 .*num_warps=3 is not one of"):
        t.baseline_for(n(250))


def test_a_missing_shape_dimension_names_the_rule_field_and_shape():
    t = template('[[baselines]]\nsource = "s"\nwhen = "E == 128"\npoint = { BLOCK = 16 }')
    with pytest.raises(TemplateError, match=r"\[0\] when: shape n5 has no dimension 'E'"):
        t.baseline_for(n(5))
    t = template('[[baselines]]\nsource = "s"\nnearest = "T"\npoints = { "1" = { BLOCK = 16 } }')
    with pytest.raises(TemplateError, match=r"\[0\] nearest: shape n5 has no integer dimension 'T'"):
        t.baseline_for(n(5))


def test_an_expression_that_fails_on_a_shape_says_so():
    t = template('[[baselines]]\nsource = "s"\ncomputed = { num_warps = "4 // (N - 5)" }')
    with pytest.raises(TemplateError, match=r"computed num_warps: '4 // \(N - 5\)' fails on shape n5 \(ZeroDivisionError"):
        t.baseline_for(n(5))


def test_rules_are_listed_with_their_sources():
    lines = [r.describe() for r in template(TABLE).baseline_rules]
    assert lines[0] == "[0] when N <= 100; nearest N in 1, 3, 64 (source: tuned table)"
    assert lines[1] == "[1] when N > 1000; BLOCK=128; num_warps=min(4, cdiv(N, 1000)) (source: heuristic)"


# -- the search starts at the baseline points -----------------------------------------------------


def test_a_study_starts_at_the_distinct_baseline_points_of_its_shapes():
    t = template(TABLE)
    shapes = [n(1), n(2), n(500), n(1500)]
    assert start_points(t, shapes) == [{"BLOCK": 16, "num_warps": 1}, {"BLOCK": 64, "num_warps": 2},
                                       {"BLOCK": 128, "num_warps": 2}]
    assert start_points(t, [n(1500)]) == [{"BLOCK": 128, "num_warps": 2}]
    assert start_points(template(), shapes) == [{"BLOCK": 64, "num_warps": 4}]


@pytest.mark.parametrize("name", ["grid", "random", "tpe"])
def test_strategies_ask_every_baseline_point_first_once(name):
    t = template(TABLE)
    firsts = start_points(t, [n(1), n(500), n(1500), n(2)])
    strategy = make_strategy(name, t.space, seed=1, baseline=firsts)
    asked = [strategy.ask() for _ in range(len(firsts))]
    assert asked == firsts and strategy.baseline == firsts[0]
    for point in asked:
        strategy.tell(point, 1.0)
    rest = []
    while (point := strategy.ask()) is not None:
        rest.append(point)
        strategy.tell(point, 2.0)
    assert not [p for p in rest if p in firsts] and len(rest) == 12 - len(firsts)


# -- the command line lists the rules; `new` scaffolds a variant without them ---------------------


def test_templates_lists_the_rules_and_sources_and_new_drops_them(tmp_path):
    import shutil
    from pathlib import Path

    from click.testing import CliRunner

    from kernelforge.cli.main import main

    fixtures = Path(__file__).resolve().parent / "fixtures" / "kernels"
    kernels = tmp_path / "kernels"
    shutil.copytree(fixtures / "toy" / "axpy_rules", kernels / "toy" / "axpy_rules")
    shutil.copytree(fixtures / "toy" / "axpy", kernels / "toy" / "axpy")  # axpy_rules' block subclasses it

    def invoke(*args):
        return CliRunner().invoke(main, ["--kernels", str(kernels), *args], catch_exceptions=False)

    listing = invoke("templates", "toy/axpy_rules")
    assert listing.exit_code == 0, listing.output
    assert "baseline source: toy default point" in listing.output
    assert "[0] when N < 100; nearest N in 1, 16 (source: toy tuned table by N)" in listing.output
    assert "[1] when N >= 500; num_warps=min(4, cdiv(N, 512)) (source: toy computed warps)" in listing.output
    scaffold = invoke("new", "toy/axpy_rules/wide")
    assert scaffold.exit_code == 0, scaffold.output
    text = (kernels / "toy/axpy_rules/wide.py.j2").read_text()
    assert "[[baselines]]" not in text and "baseline_source" not in text and "[baseline]" in text
    variant = Template.from_file(kernels / "toy/axpy_rules/wide.py.j2", "toy/axpy_rules")
    assert variant.baseline_rules == () and variant.baseline == {"BLOCK": 256, "num_warps": 4}
