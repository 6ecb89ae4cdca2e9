"""Templates, spaces and discovery: headers are validated, renders are strict, names resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernelforge.candidate import Candidate, candidate_id, source_id
from kernelforge.catalog import Catalog
from kernelforge.errors import TemplateError, UserError
from kernelforge.space import Space, parse_value
from kernelforge.template import Template

FIXTURES = Path(__file__).parent / "fixtures" / "kernels"

HEADER = """{{#-
[template]
role = "variant"
constraints = {constraints}

[space]
BLOCK = [16, 32, 64]
num_warps = [2, 4]

[baseline]
BLOCK = {baseline}
num_warps = 4
-#}}
"""
BODY = "BLOCK = {{ BLOCK }}\nWARPS = {{ num_warps }}\n"


def make(body: str = BODY, constraints: str = "[]", baseline: str = "32") -> Template:
    text = HEADER.format(constraints=constraints, baseline=baseline) + body
    return Template.from_text(text, template_id="toy/axpy/t", block_id="toy/axpy", where="t.py.j2")


def test_render_at_a_point_and_baseline():
    template = make()
    assert template.render_baseline().endswith("BLOCK = 32\nWARPS = 4\n")
    assert "BLOCK = 64" in template.render({"BLOCK": 64, "num_warps": 2})


@pytest.mark.parametrize(
    "point, fragment",
    [
        ({"BLOCK": 32}, "missing parameter(s) num_warps"),
        ({"BLOCK": 32, "num_warps": 4, "EXTRA": 1}, "unknown parameter(s) EXTRA"),
        ({"BLOCK": 48, "num_warps": 4}, "BLOCK=48 is not one of [16, 32, 64]"),
        # Equal in Python, not the same source: a float where an integer renders, a switch for a number.
        ({"BLOCK": 32.0, "num_warps": 4}, "BLOCK=32.0 is not one of [16, 32, 64]"),
        ({"BLOCK": 32, "num_warps": True}, "num_warps=True is not one of [2, 4]"),
    ],
)
def test_render_rejects_bad_points(point, fragment):
    with pytest.raises(TemplateError, match=fragment.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        make().render(point)


def test_template_variables_must_equal_the_space():
    with pytest.raises(TemplateError, match="uses undeclared BLOCK_N"):
        make(BODY + "{{ BLOCK_N }}\n")
    with pytest.raises(TemplateError, match="declares unused num_warps"):
        make("BLOCK = {{ BLOCK }}\n")


def test_constraints_filter_points_and_baseline():
    template = make(constraints='["BLOCK * num_warps <= 128"]')
    points = list(template.space.points())
    assert {"BLOCK": 64, "num_warps": 4} not in points and {"BLOCK": 64, "num_warps": 2} in points
    with pytest.raises(TemplateError, match="violates constraint 'BLOCK \\* num_warps <= 64' at BLOCK=32, num_warps=4"):
        make(constraints='["BLOCK * num_warps <= 64"]')


@pytest.mark.parametrize(
    "constraint, fragment",
    [
        ('["BLOCK_Q < 2"]', "unknown parameter"),
        ('["__import__(\'os\')"]', "may only call min, max or abs"),
        ('["__import__ < 2"]', r"unknown parameter\(s\) __import__"),
        ('["min(BLOCK)(1)"]', "may only call min, max or abs"),
        ('["len(str(BLOCK)) < 9"]', "may only call min, max or abs"),
        ('["BLOCK.real > 0"]', "Attribute"),
        ('["BLOCK <"]', "not a valid expression"),
    ],
)
def test_constraints_cannot_run_code_or_name_unknowns(constraint, fragment):
    with pytest.raises(UserError, match=fragment):
        make(constraints=constraint)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("no header here\n", "no header"),
        ("{#- [template\n-#}\n", "not valid TOML"),
        ("{#-\n[template]\n-#}\n", "no \\[space\\]"),
        ("{#-\n[space]\nB = 4\n-#}\n{{ B }}", "must list its allowed values"),
        ("{#-\n[space]\nB = [1]\n[baseline]\nB = 1\n[other]\n-#}\n{{ B }}", "unknown header table"),
        ("{#-\n[space]\nB = [1]\n[baseline]\nB = 1\n-#}\n{% if %}", "Jinja syntax error"),
        ("{#-\n[template]\nrole = \"boss\"\n[space]\nB = [1]\n[baseline]\nB = 1\n-#}\n{{ B }}", "role"),
        # Values a parameter cannot take, and names a body cannot read.
        ("{#-\n[space]\nB = [1979-05-27]\n-#}\n{{ B }}", "B: 1979-05-27 is a date or time, which no parameter"),
        ("{#-\n[space]\nB = [[1, 2]]\n-#}\n{{ B }}", "B: \\[1, 2\\] is an array"),
        ("{#-\n[space]\nB = [1.0, nan]\n-#}\n{{ B }}", "B: nan is not a finite number"),
        ("{#-\n[space]\nif = [1]\n[baseline]\nif = 1\n-#}\n1", "'if' is a Python keyword; rename it"),
        ("{#-\n[space]\ntrue = [1]\n[baseline]\ntrue = 1\n-#}\n1", "true is a constant in a template body"),
        ("{#-\n[space]\nrange = [1]\n[baseline]\nrange = 1\n-#}\n1", "range is the body's range"),
        ("{#-\n[space]\nB = [1]\n[baseline]\nB = 1\n[ties]\nloop = \"B\"\n-#}\n{{ B }}",
         "\\[ties\\]: loop is a name a template body may not use"),
    ],
)
def test_malformed_templates_name_the_problem(text, fragment):
    with pytest.raises(UserError, match=fragment) as info:
        Template.from_text(text, template_id="toy/axpy/x", block_id="toy/axpy", where="x.py.j2")
    assert str(info.value).startswith("x.py.j2")


def test_space_grid_and_size():
    space = Space.build({"A": [1, 2], "B": ["x", "y", "z"]}, ["A < 2 or B != 'z'"], where="w")
    assert space.size == 6
    assert len(list(space.points())) == 5


def test_parse_value():
    assert parse_value("64") == 64 and parse_value("0.5") == 0.5
    assert parse_value("true") is True and parse_value("tl.float32") == "tl.float32"


def test_candidate_id_is_the_hash_of_its_source():
    template = make()
    a = Candidate.from_template(template)
    b = Candidate.from_template(template, {"BLOCK": 32, "num_warps": 4})
    c = Candidate.from_template(template, {"BLOCK": 64, "num_warps": 4})
    assert a.id == b.id == candidate_id(template.id, a.source) and a.id != c.id
    assert a.id != source_id(a.source)  # the template's id is part of it (see the next test)
    assert a.origin == "manual"  # a variant's baseline point is not the human baseline


def test_templates_differing_only_in_their_header_have_different_candidates_and_resume_finds_them(tmp_path):
    from kernelforge.llm.parse import llm_template
    from kernelforge.store.store import Store

    # Same body, same point: only the [baseline] header line differs (the rendered text is the same).
    one = llm_template(HEADER.format(constraints="[]", baseline="32") + BODY, "toy/axpy", "a")
    two = llm_template(HEADER.format(constraints="[]", baseline="16") + BODY, "toy/axpy", "b")
    point = {"BLOCK": 32, "num_warps": 4}
    a, b = Candidate.from_template(one, point), Candidate.from_template(two, point)
    assert a.source == b.source and one.id != two.id
    assert a.id != b.id
    store = Store(f"sqlite:///{tmp_path / 'ids.db'}")
    store.add_candidate(a)
    store.add_candidate(b)
    assert {store.candidate(a.id).template, store.candidate(b.id).template} == {one.id, two.id}
    # A resumed search renders the same template again: the same id, the stored candidate.
    again = llm_template(one.text, "toy/axpy", "a again")
    assert Candidate.from_template(again, point).id == a.id and store.candidate(a.id).template == one.id


def test_catalog_discovers_fixture_blocks_and_suggests_names():
    catalog = Catalog.discover(FIXTURES)
    assert "toy/axpy" in catalog.blocks
    assert catalog.baseline("toy/axpy").id == "toy/axpy/baseline"
    assert catalog.resolve("toy/axpy").id == "toy/axpy/baseline"
    assert Candidate.from_template(catalog.baseline("toy/axpy")).origin == "baseline"
    with pytest.raises(UserError, match="did you mean toy/axpy"):
        catalog.block("toy/axpyy")
    with pytest.raises(UserError, match="toy/axpy has toy/axpy/baseline"):
        catalog.template("toy/axpy/nope")
    with pytest.raises(UserError, match="does not exist"):
        Catalog.discover(FIXTURES / "missing")


def test_points_in_reverse_start_from_the_grids_end():
    template = make(constraints='["BLOCK * num_warps <= 128"]')
    forward = list(template.space.points())
    assert list(template.space.points(reverse=True)) == forward[::-1]


# -- a header cannot loosen the judge (issue 29) -------------------------------------------------


@pytest.mark.parametrize("line, fragment", [
    ("deterministic = false", "[template] deterministic: the judge's rules"),
    ("rtol = 0.5", "[template] rtol: the judge's rules"),
    ("held_out = []", "[template] held_out: the judge's rules"),
    ("speedup = 9.0", "[template] speedup: unknown key"),
])
def test_a_header_key_that_would_set_a_rule_of_the_judge_is_refused_with_its_name(line, fragment):
    text = HEADER.format(constraints="[]", baseline="32").replace('role = "variant"', f'role = "variant"\n{line}') + BODY
    with pytest.raises(TemplateError) as err:
        Template.from_text(text, template_id="toy/axpy/t", block_id="toy/axpy", where="t.py.j2")
    assert fragment in str(err.value)
    from kernelforge.llm.parse import parse_answer

    parsed = parse_answer(f"```\n{text}```\n", "toy/axpy")
    assert not parsed.ok and fragment in parsed.message


def test_a_proposed_template_is_a_variant_of_origin_llm_without_baselines_whatever_its_header_says():
    from kernelforge.llm.parse import parse_answer

    text = (HEADER.format(constraints="[]", baseline="32")
            .replace('role = "variant"', 'role = "baseline"\norigin = "human"\nbaseline_source = "trust me"')
            .replace("-#}", '[[baselines]]\nsource = "mine"\npoint = { BLOCK = 64 }\n-#}') + BODY)
    human = Template.from_text(text, template_id="toy/axpy/t", block_id="toy/axpy", where="t.py.j2")
    assert human.role == "baseline" and human.baseline_rules  # a template of the project may say so
    parsed = parse_answer(f"```\n{text}```\n", "toy/axpy")
    assert parsed.ok, parsed.message
    proposed = parsed.template
    assert (proposed.role, proposed.origin, proposed.baseline_rules) == ("variant", "llm", ())
    assert proposed.baseline_source != "trust me"


# A header-only variant that renders the file `wide.py.j2`'s body with WARPS2 tied to num_warps.
TIED = """{#-
[template]
role = "variant"
body = "wide"

[space]
BLOCK = [16, 32]
num_warps = [2, 4]

[baseline]
BLOCK = 16
num_warps = 2

[ties]
WARPS2 = "num_warps"
-#}
"""
WIDE = """{#-
[template]
role = "variant"

[space]
BLOCK = [16, 32, 64]
num_warps = [2, 4]
WARPS2 = [2, 4, 8]

[baseline]
BLOCK = 32
num_warps = 4
WARPS2 = 8
-#}
BLOCK = {{ BLOCK }}
WARPS = {{ num_warps }}, {{ WARPS2 }}
"""


def _folder(tmp_path: Path, **files: str) -> Path:
    for name, text in files.items():
        (tmp_path / f"{name}.py.j2").write_text(text)
    return tmp_path


def test_a_header_only_template_renders_another_templates_body_with_its_ties(tmp_path):
    folder = _folder(tmp_path, wide=WIDE, tied=TIED)
    wide = Template.from_file(folder / "wide.py.j2", "toy/axpy")
    tied = Template.from_file(folder / "tied.py.j2", "toy/axpy")
    assert tied.space.names == ("BLOCK", "num_warps") and tied.ties == {"WARPS2": "num_warps"}
    assert tied.body_of == "wide" and wide.body_of is None and not wide.ties
    assert tied.render({"BLOCK": 32, "num_warps": 4}) == wide.render({"BLOCK": 32, "num_warps": 4, "WARPS2": 4})
    assert tied.render_baseline() == "BLOCK = 16\nWARPS = 2, 2\n"
    # Its text is the whole template (what a store or an LLM prompt holds), and parses on its own.
    assert tied.text.startswith(TIED.rstrip()) and tied.text.endswith("WARPS = {{ num_warps }}, {{ WARPS2 }}\n")
    again = Template.from_text(tied.text, template_id=tied.id, block_id="toy/axpy", where="stored")
    assert again.render({"BLOCK": 16, "num_warps": 4}) == tied.render({"BLOCK": 16, "num_warps": 4})
    # The two are different candidates of the same kernel text.
    assert Candidate.from_template(tied, {"BLOCK": 32, "num_warps": 4}).id != \
        Candidate.from_template(wide, {"BLOCK": 32, "num_warps": 4, "WARPS2": 4}).id


@pytest.mark.parametrize(
    "files, fragment",
    [
        ({"tied": TIED}, r"tied.py.j2 \[template\] body: 'wide' is not another template"),
        ({"tied": TIED.replace('body = "wide"', 'body = "tied"'), "wide": WIDE}, "is not another template"),
        ({"tied": TIED.replace('"wide"', '"../wide"'), "wide": WIDE}, r"\[template\] body: must name a template"),
        ({"tied": TIED + "EXTRA\n", "wide": WIDE}, "has a body of its own"),
        ({"tied": TIED, "wide": TIED.replace('"wide"', '"tied"')}, "takes its body from another template itself"),
        ({"tied": TIED.replace('WARPS2 = "num_warps"', 'WARPS2 = "warps"'), "wide": WIDE},
         r"\[ties\] WARPS2: must name the \[space\] parameter"),
        ({"tied": TIED.replace('WARPS2 = "num_warps"', 'BLOCK = "num_warps"'), "wide": WIDE},
         r"\[ties\] BLOCK: is a \[space\] parameter"),
        ({"tied": TIED.replace('WARPS2 = "num_warps"', 'moe_align = "num_warps"'), "wide": WIDE},
         r"\[ties\]: moe_align is the name of kernel text"),
        ({"tied": TIED.replace('WARPS2 = "num_warps"', ''), "wide": WIDE}, "uses undeclared WARPS2"),
        ({"tied": TIED.replace('WARPS2 = "num_warps"', 'WARPS2 = "num_warps"\nWARPS3 = "BLOCK"'), "wide": WIDE},
         r"must equal its \[space\] and \[ties\]: declares unused WARPS3"),
        ({"tied": TIED.replace("[ties]", "[tie]"), "wide": WIDE}, r"unknown header table\(s\) tie"),
    ],
)
def test_a_body_or_a_tie_that_cannot_hold_is_refused_naming_the_file_and_field(tmp_path, files, fragment):
    folder = _folder(tmp_path, **files)
    with pytest.raises(TemplateError, match=fragment) as info:
        Template.from_file(folder / "tied.py.j2", "toy/axpy")
    assert str(info.value).startswith(str(folder / "tied.py.j2"))


SHIPPED = '''{#-
[template]
role = "baseline"
origin = "human"
description = """The shipped design: one line, \\
and a second."""
baseline_source = "the serving engine's default"

[space]
BLOCK = [16, 32, 64]
num_warps = [2, 4]

[baseline]
BLOCK = 32
num_warps = 4

[[baselines]]
source = "the engine's small-block rule"
point = { BLOCK = 16 }
-#}
BLOCK = {{ BLOCK }}
WARPS = {{ num_warps }}
'''


@pytest.mark.parametrize("header_only", [False, True])
def test_a_variant_scaffolded_from_the_baseline_is_valid_and_starts_at_its_baseline_point(tmp_path, header_only):
    from kernelforge.scaffold import variant_text

    folder = _folder(tmp_path, baseline=SHIPPED)
    baseline = Template.from_file(folder / "baseline.py.j2", "toy/axpy")
    assert baseline.baseline_rules and baseline.baseline_source == "the serving engine's default"
    (folder / "mine.py.j2").write_text(variant_text(baseline, header_only=header_only))
    mine = Template.from_file(folder / "mine.py.j2", "toy/axpy")
    assert mine.role == "variant" and mine.description == "Variant of toy/axpy/baseline: describe your change"
    assert not mine.baseline_rules and mine.baseline_source != baseline.baseline_source
    assert mine.space == baseline.space and mine.render_baseline() == "BLOCK = 32\nWARPS = 4\n"
    body = (folder / "mine.py.j2").read_text().split("-#}")[1]
    assert (mine.body_of, body.strip()) == (("baseline", "") if header_only else (None, "BLOCK = {{ BLOCK }}\n"
                                                                                   "WARPS = {{ num_warps }}"))


def test_a_variant_of_a_header_only_baseline_names_the_same_body_or_copies_it(tmp_path):
    from kernelforge.scaffold import variant_text

    folder = _folder(tmp_path, wide=WIDE, tied=TIED.replace('role = "variant"', 'role = "baseline"'))
    tied = Template.from_file(folder / "tied.py.j2", "toy/axpy")
    for name, header_only in (("header", True), ("copy", False)):
        (folder / f"{name}.py.j2").write_text(variant_text(tied, header_only=header_only))
    header, copy = (Template.from_file(folder / f"{name}.py.j2", "toy/axpy") for name in ("header", "copy"))
    assert (header.body_of, copy.body_of) == ("wide", None)  # no chain: the template that holds the body
    assert header.render({"BLOCK": 32, "num_warps": 2}) == copy.render({"BLOCK": 32, "num_warps": 2}) == \
        tied.render({"BLOCK": 32, "num_warps": 2})


def test_an_error_in_a_shared_body_names_the_file_and_line_that_hold_it(tmp_path):
    broken = WIDE.replace("WARPS = {{ num_warps }}", "WARPS = {{ num_warps.real }}")
    folder = _folder(tmp_path, wide=broken, tied=TIED)
    line = broken.splitlines().index("WARPS = {{ num_warps.real }}, {{ WARPS2 }}") + 1
    for name in ("tied", "wide"):  # whichever the catalog loads first
        with pytest.raises(TemplateError, match=rf"^{folder / 'wide.py.j2'}:{line}: Getattr"):
            Template.from_file(folder / f"{name}.py.j2", "toy/axpy")
    folder = _folder(tmp_path, wide=WIDE.replace("{{ WARPS2 }}", "{{ WARPS2 }} {{ WARPS3 }}") + "", tied=TIED)
    with pytest.raises(TemplateError, match=r"tied.py.j2: .*the body \(.*wide.py.j2\) uses undeclared WARPS3: add it "
                                            r"to \[space\] or \[ties\]"):
        Template.from_file(folder / "tied.py.j2", "toy/axpy")


def test_a_tied_name_is_not_a_parameter_to_give(tmp_path):
    tied = Template.from_file(_folder(tmp_path, wide=WIDE, tied=TIED) / "tied.py.j2", "toy/axpy")
    with pytest.raises(TemplateError, match=r"WARPS2 is tied to num_warps \(\[ties\]\): give num_warps"):
        tied.render({"BLOCK": 16, "num_warps": 2, "WARPS2": 4})


def test_a_template_that_is_not_utf8_or_has_no_string_description_is_one_clear_error(tmp_path):
    path = tmp_path / "latin.py.j2"
    path.write_bytes(WIDE.encode() + b"# caf\xe9\n")
    with pytest.raises(TemplateError, match=r"latin.py.j2: not UTF-8 text \(byte 0xe9 at offset \d+\)"):
        Template.from_file(path, "toy/axpy")
    path.write_text(WIDE.replace('role = "variant"', 'role = "variant"\ndescription = 5'))
    with pytest.raises(TemplateError, match=r"latin.py.j2 \[template\] description: must be a string"):
        Template.from_file(path, "toy/axpy")


def test_a_header_error_names_the_files_line_and_a_byte_order_mark_is_no_error(tmp_path):
    path = tmp_path / "wide.py.j2"
    path.write_text("\n\n" + WIDE.replace("BLOCK = 32", "BLOCK = 32 32"))
    line = ("\n\n" + WIDE).splitlines().index("BLOCK = 32") + 1
    with pytest.raises(TemplateError, match=rf"header is not valid TOML \(.*at line {line} of the file"):
        Template.from_file(path, "toy/axpy")
    path.write_text(WIDE.replace("-#}", ""))
    with pytest.raises(TemplateError, match=r"the header's opening \{#- is never closed; end the header with -#\}"):
        Template.from_file(path, "toy/axpy")
    path.write_bytes(b"\xef\xbb\xbf" + WIDE.encode())
    assert Template.from_file(path, "toy/axpy").render_baseline() == "BLOCK = 32\nWARPS = 4, 8\n"


def test_a_block_folder_needs_one_baseline_and_template_names_that_are_identifiers(tmp_path):
    import shutil

    shutil.copytree(FIXTURES / "toy", tmp_path / "toy")
    folder = tmp_path / "toy" / "axpy"
    baseline = (folder / "baseline.py.j2").read_text()
    (folder / "second.py.j2").write_text(baseline)
    with pytest.raises(UserError, match=r'block toy/axpy must have exactly one template with role = "baseline", found '
                                        r"2 \(baseline.py.j2, second.py.j2\)"):
        Catalog.discover(tmp_path).templates("toy/axpy")
    (folder / "second.py.j2").unlink()
    (folder / "my-variant.py.j2").write_text(baseline.replace('role = "baseline"', 'role = "variant"'))
    with pytest.raises(UserError, match=r"my-variant.py.j2: a template's name must be a Python identifier"):
        Catalog.discover(tmp_path).templates("toy/axpy")


def test_a_broken_template_stops_only_what_uses_it(tmp_path):
    import shutil

    from click.testing import CliRunner

    from kernelforge.cli.main import main
    from kernelforge.job import load_job
    from kernelforge.search.plan import plan_studies
    from toy_job import job_text

    shutil.copytree(FIXTURES / "toy", tmp_path / "toy")
    folder = tmp_path / "toy" / "axpy"
    variant = (folder / "baseline.py.j2").read_text().replace('role = "baseline"', 'role = "variant"')
    (folder / "good.py.j2").write_text(variant)
    (folder / "mid_edit.py.j2").write_text(variant.replace("[space]", "[space]\nwhen = [2026-12-07]"))
    catalog = Catalog.discover(tmp_path)
    error = "mid_edit.py.j2 \\[space\\]: parameter when: 2026-12-07 is a date or time"
    # What uses the broken file stops on its error; what does not, works.
    for use in (lambda: catalog.templates("toy/axpy"), lambda: catalog.template("toy/axpy/mid_edit"),
                lambda: catalog.templates("toy/axpy", ["good", "mid_edit"])):
        with pytest.raises(UserError, match=error):
            use()
    assert catalog.baseline("toy/axpy").id == "toy/axpy/baseline"
    assert [t.id for t in catalog.templates("toy/axpy", ["good"])] == ["toy/axpy/baseline", "toy/axpy/good"]
    assert catalog.template("toy/axpy/good").render_baseline() == catalog.baseline("toy/axpy").render_baseline()
    (folder / ".#good.py.j2").symlink_to("user@host.1234:1")  # an editor's lock file is no template
    assert catalog.listing("toy/axpy").names == ["baseline", "good", "mid_edit"]
    # A job that names the good variant searches it; one that searches every template says what is broken.
    (tmp_path / "named.toml").write_text(job_text("named") + 'templates = ["good"]\n')
    planned = plan_studies(load_job(tmp_path / "named.toml", catalog), catalog)
    assert planned and {study.template_id for study in planned} == {"toy/axpy/good"}
    (tmp_path / "every.toml").write_text(job_text("every"))
    with pytest.raises(UserError, match=error):
        load_job(tmp_path / "every.toml", catalog)
    # The listing shows what loads and what does not, and exits 1.
    result = CliRunner().invoke(main, ["--kernels", str(tmp_path), "templates", "toy/axpy"])
    assert result.exit_code == 1 and "toy/axpy/good" in result.output and "Traceback" not in result.output
    wrong = CliRunner().invoke(main, ["--kernels", str(tmp_path), "render", "toy/axpi/good"])
    assert f"`kernelforge --kernels {tmp_path} templates` list" in " ".join(wrong.output.split())  # one that works
    assert "not loaded: every command that uses these templates stops on them" in result.output
    assert "mid_edit.py.j2 [space]: parameter when" in result.output
    # With no baseline that loads, the error names the broken files (the baseline may be one of them).
    (folder / "baseline.py.j2").write_text("{#- [template\n-#}\n")
    with pytest.raises(UserError, match="toy/axpy has no baseline template that loads, and the baseline may be a "
                                        "broken one: .*baseline.py.j2: header is not valid TOML"):
        Catalog.discover(tmp_path).template("toy/axpy/good")


@pytest.mark.parametrize("edit", [
    lambda t: t.replace('role = "baseline"', "role = 'baseline'"),
    lambda t: t.replace('baseline_source = "the serving engine\'s default"',
                        'baseline_source = """the serving\nengine\'s default"""'),
    lambda t: t.replace('[template]', '[ template ]  # what this is'),
    lambda t: re.sub(r'description = """[^"]*"""', 'description = "one line"  # and a comment', t),
])
def test_the_scaffold_takes_any_way_of_writing_the_baselines_header(tmp_path, edit):
    from kernelforge.scaffold import variant_text

    text = edit(SHIPPED)
    assert text != SHIPPED
    baseline = Template.from_file(_folder(tmp_path, baseline=text) / "baseline.py.j2", "toy/axpy")
    for header_only in (False, True):
        (tmp_path / "mine.py.j2").write_text(variant_text(baseline, header_only=header_only))
        mine = Template.from_file(tmp_path / "mine.py.j2", "toy/axpy")
        assert mine.role == "variant" and not mine.baseline_rules and mine.space == baseline.space
        assert mine.body_of == ("baseline" if header_only else None)


def test_a_text_on_its_own_must_hold_the_body_it_names():
    with pytest.raises(TemplateError, match=r"stored \[template\] body: the body of wide.py.j2 is joined"):
        Template.from_text(TIED, template_id="toy/axpy/tied", block_id="toy/axpy", where="stored")


def test_a_joined_template_over_the_size_limit_is_refused_naming_the_header_file(tmp_path):
    from kernelforge.limits import MAX_SOURCE_CHARS

    padded = WIDE + "{# " + "x" * (MAX_SOURCE_CHARS - len(WIDE) - 10) + " #}\n"  # just under the limit alone
    folder = _folder(tmp_path, wide=padded, tied=TIED)
    assert Template.from_file(folder / "wide.py.j2", "toy/axpy").body_of is None
    with pytest.raises(TemplateError, match=r"tied.py.j2: the template has \d+ characters, over the limit"):
        Template.from_file(folder / "tied.py.j2", "toy/axpy")


def test_a_broken_block_stops_only_what_uses_it(tmp_path):
    import shutil

    from click.testing import CliRunner

    from kernelforge.cli.main import main

    shutil.copytree(FIXTURES / "toy", tmp_path / "toy")
    router = tmp_path / "toy" / "router" / "block.py"
    router.write_text(router.read_text() + "\nimport no_such_module_here\n")
    catalog = Catalog.discover(tmp_path)
    assert "toy/axpy" in catalog.blocks and "toy/router" not in catalog.blocks
    assert catalog.baseline("toy/axpy").id == "toy/axpy/baseline"
    with pytest.raises(UserError, match=r"router/block.py: importing it raised ModuleNotFoundError: No module named "
                                        "'no_such_module_here'"):
        catalog.block("toy/router")
    result = CliRunner().invoke(main, ["--kernels", str(tmp_path), "blocks"])
    assert result.exit_code == 1 and "toy/axpy" in result.output and "Traceback" not in result.output
    assert "importing it raised ModuleNotFoundError" in " ".join(result.output.split())
    # A block class that leaves an abstract method undefined is told which.
    source = router.read_text().replace("\nimport no_such_module_here\n", "")
    router.write_text(source.replace("    def counts(", "    def _not_counts("))
    with pytest.raises(UserError, match="does not define counts, which every block defines"):
        Catalog.discover(tmp_path).block("toy/router")
