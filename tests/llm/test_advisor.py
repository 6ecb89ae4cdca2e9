"""The LLM point adviser against the loopback chat-completions server (tests/llm_server.py: the
real openai client over HTTP, scripted answers): valid points are taken, invalid ones reported,
every exchange is in the LLM log without the key; a 500 or garbage is no advice and the search
goes on; in a search, the advised points are evaluated right after the baseline and the job's
strategy learns them; ``--llm replay`` sends nothing; without ``[llm]`` nothing is wrapped."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from kernelforge.catalog import Catalog
from kernelforge.errors import UserError
from kernelforge.job import load_job
from kernelforge.llm_spec import LLMSpec
from kernelforge.llm.advisor import PURPOSE, PointAdvisor, advice_for, parse_points
from kernelforge.search.search import Search
from kernelforge.store.store import Store
from llm_server import Reply, ScriptedServer
from kf_progress import Recorder

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"
BLOCK = "toy/axpy"
KEY = "sk-kftest-ADVISOR-LEAKCHECK-4b1d"
KEY_ENV = "KF_TEST_ADVISOR_KEY"
#: toy/axpy's space: BLOCK in [64, 256, 1024], num_warps in [1, 2, 4]; baseline (256, 4).
GOOD = [{"BLOCK": 1024, "num_warps": 1}, {"BLOCK": 64, "num_warps": 2}, {"BLOCK": 1024, "num_warps": 4}]
BAD = {"BLOCK": 512, "num_warps": 4}
ANSWER = "These should do well:\n\n```json\n" + json.dumps([GOOD[0], BAD, GOOD[1], GOOD[2]]) + "\n```\n"

JOB = """
[job]
name = "{name}"
device = "interpret"
dtype = "float16"
seed = 3

[strategy]
name = "{strategy}"
evaluations = 6

[[blocks]]
id = "toy/axpy"
shapes = "smoke"
{llm}
"""



@pytest.fixture(scope="module")
def catalog():
    return Catalog.discover(FIXTURES)


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


def adviser(catalog, store, spec: LLMSpec, count: int = 5, progress=None) -> PointAdvisor:
    block = catalog.block(BLOCK)
    return PointAdvisor(spec, job_name="adv", store=store, block=block, template=catalog.baseline(BLOCK),
                        shapes=block.shapes("smoke"), dtype_name="float16", env={"device": "interpret"},
                        count=count, progress=progress)


def live_spec(server, **changes) -> LLMSpec:
    return replace(LLMSpec(base_url=server.base_url, model="m", api_key_env=KEY_ENV, timeout_s=5.0, max_retries=2),
                   **changes)


def assert_no_key(*texts):
    for text in texts:
        assert KEY not in (text.decode("latin-1") if isinstance(text, bytes) else text)


def test_valid_points_are_taken_invalid_ones_reported_and_the_exchange_logged(tmp_path, catalog, key):
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    recorder = Recorder()
    with ScriptedServer([Reply(ANSWER)]) as server:
        advice = adviser(catalog, store, live_spec(server), progress=recorder).advise(
            [({"BLOCK": 256, "num_warps": 4}, 1.0)])
    assert advice.error is None and advice.tokens > 0
    assert list(advice.points) == GOOD
    assert [(p, "BLOCK=512 is not one of [64, 256, 1024]") for p in [BAD]] == list(advice.invalid)
    assert server.auth == [f"Bearer {key}"], "the key travels in the Authorization header only"
    prompt = server.requests[0]["messages"][1]["content"]
    for fact in ("toy/axpy", "BLOCK: [64, 256, 1024]", "num_warps: [1, 2, 4]", '{"BLOCK": 256, "num_warps": 4} -> 1',
                 "Propose up to 5 points"):
        assert fact in prompt
    (row,) = store.llm_calls("adv")
    assert (row.purpose, row.kind, row.status, row.template_id) == (PURPOSE, "advice", "ok", catalog.baseline(BLOCK).id)
    assert "3 point(s) taken, 1 refused" in row.message and "512" in row.message
    assert store.llm_usage("adv").requests == 1, "an advice request counts against [llm] max_calls"
    assert recorder.events == [("llm_advice", {"block": BLOCK, "template": catalog.baseline(BLOCK).id, "points": 3,
                                               "invalid": 1, "tokens": advice.tokens, "replayed": False,
                                               "message": ""})]
    store.close()
    assert_no_key((tmp_path / "a.db").read_bytes(), json.dumps(recorder.events))


@pytest.mark.parametrize("script, fragment", [
    ([Reply(status=500), Reply(status=500)], "server_error: 500"),
    ([Reply("Larger blocks are usually faster; try them.")], "no JSON list"),
    ([Reply('```json\n[{"BLOCK": 2}, {"BLOCK": 256, "num_warps": 4}]\n```')], "no valid new point"),
])
def test_a_failed_request_or_an_unusable_answer_is_no_advice(tmp_path, catalog, key, script, fragment):
    store = Store(f"sqlite:///{tmp_path / 'b.db'}")
    with ScriptedServer(script) as server:
        advice = adviser(catalog, store, live_spec(server)).advise([({"BLOCK": 256, "num_warps": 4}, 1.0)])
    assert advice.points == () and fragment in advice.error
    assert len(server.requests) == len(script), "one request, retried once at most"
    rows = store.llm_calls("adv")
    assert len(rows) == len(script) and rows[-1].kind == "no_advice"


def test_a_spent_call_budget_sends_nothing(tmp_path, catalog, key):
    store = Store(f"sqlite:///{tmp_path / 'c.db'}")
    with ScriptedServer([Reply(ANSWER), Reply(ANSWER)]) as server:
        spec = live_spec(server, max_calls=1)
        assert adviser(catalog, store, spec).advise([]).points
        advice = adviser(catalog, store, spec).advise([])
    assert len(server.requests) == 1 and advice.points == () and "max_calls = 1" in advice.error


def test_answers_are_read_from_fences_objects_or_bare_text():
    assert parse_points('```json\n{"points": [{"a": 1}]}\n```') == [{"a": 1}]
    assert parse_points('Sure: [{"a": 1}, {"a": 2}] - good luck') == [{"a": 1}, {"a": 2}]
    assert parse_points("```python\nprint(1)\n```\n```json\n[]\n```") == []
    assert parse_points("no idea") is None


def write_job(folder: Path, name: str, *, strategy: str = "tpe", llm: str = "") -> Path:
    path = folder / f"{name}.toml"
    path.write_text(JOB.format(name=name, strategy=strategy, llm=llm))
    return path


def search(tmp_path: Path, job, db: str):
    catalog = Catalog.discover(FIXTURES)
    store = Store(f"sqlite:///{tmp_path / db}")
    recorder = Recorder()
    outcome = Search(job, catalog, store, recorder, compile_enabled=False, in_process=True,
                     advisor=advice_for).run()  # wired as kernelforge.start wires it
    evaluated = [e["params"] for kind, e in recorder.events if kind == "evaluated" and e.get("params")]
    return store, recorder, outcome, evaluated


@pytest.mark.interpreter
@pytest.mark.parametrize("strategy", ["tpe", "random"])
def test_a_search_evaluates_the_advice_first_then_its_strategy_and_replays_it_offline(tmp_path, key, capfd,
                                                                                       strategy):
    catalog = Catalog.discover(FIXTURES)
    with ScriptedServer([Reply(ANSWER)]) as server:
        llm = (f'\n[llm]\nbase_url = "{server.base_url}"\nmodel = "m"\napi_key_env = "{KEY_ENV}"\n'
               "guide_points = 3\ntune_share = 0.01\n")
        job = load_job(write_job(tmp_path, "guided", strategy=strategy, llm=llm), catalog)
        store, recorder, outcome, evaluated = search(tmp_path, job, "guided.db")
        assert len(server.requests) == 1
        # Replayed: the same advice for the same prompt, from the first database, sent nowhere.
        replayed = replace(job, llm=replace(job.llm, replay=store.url))
        store2, recorder2, _, evaluated2 = search(tmp_path, replayed, "replayed.db")
        assert len(server.requests) == 1, "--llm replay sends nothing"
    assert outcome.evaluations == 6
    assert evaluated[:3] == GOOD, "the advice right after the baseline"
    assert {json.dumps(p, sort_keys=True) for p in evaluated[3:]}.isdisjoint(json.dumps(p, sort_keys=True)
                                                                              for p in GOOD)
    advice = [e for kind, e in recorder.events if kind == "llm_advice"]
    assert [(e["points"], e["invalid"]) for e in advice] == [(3, 1)]
    assert evaluated2[:3] == GOOD
    assert [(e["points"], e["replayed"]) for kind, e in recorder2.events if kind == "llm_advice"] == [(3, True)]
    assert store2.llm_usage("guided").requests == 0, "a replayed advice costs no call"
    store.close()
    store2.close()
    out, err = capfd.readouterr()
    assert_no_key((tmp_path / "guided.db").read_bytes(), (tmp_path / "replayed.db").read_bytes(), out, err,
                  json.dumps(recorder.events, default=str))


@pytest.mark.interpreter
def test_an_endpoint_failing_with_500_leaves_the_search_to_its_strategy(tmp_path, key):
    catalog = Catalog.discover(FIXTURES)
    with ScriptedServer([Reply(status=500)], loop=True) as server:
        llm = (f'\n[llm]\nbase_url = "{server.base_url}"\nmodel = "m"\napi_key_env = "{KEY_ENV}"\n'
               "guide_points = 3\ntune_share = 0.01\nmax_retries = 0\n")
        job = load_job(write_job(tmp_path, "down", strategy="grid", llm=llm), catalog)
        _, recorder, outcome, evaluated = search(tmp_path, job, "down.db")
    assert outcome.evaluations == 6
    grid = [p for p in catalog.baseline(BLOCK).space.points() if p != {"BLOCK": 256, "num_warps": 4}]
    assert evaluated == grid[:6], "the grid's own order"
    (advice,) = [e for kind, e in recorder.events if kind == "llm_advice"]
    assert advice["points"] == 0 and "server_error" in advice["message"]


def test_no_llm_or_no_guide_points_means_no_adviser(tmp_path, catalog):
    template, shapes = catalog.baseline(BLOCK), catalog.block(BLOCK).shapes("smoke")
    plain = load_job(write_job(tmp_path, "plain"), catalog)
    assert plain.llm is None and advice_for(SimpleNamespace(job=plain), template, shapes) is None
    off = load_job(write_job(tmp_path, "off", llm='\n[llm]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'),
                   catalog)
    assert off.llm.guide_points == 0 and advice_for(SimpleNamespace(job=off), template, shapes) is None
    on = replace(off, llm=replace(off.llm, guide_points=2))
    assert advice_for(SimpleNamespace(job=on), template, ()) is None, "a proposed template's study: no advice"


@pytest.mark.parametrize("value, fragment", [
    ("-1", "guide_points: must be at least 0"),
    ("65", "guide_points: must be between 0 and 64"),
    ('"six"', "guide_points: expected an integer"),
])
def test_guide_points_mistakes_name_the_field(tmp_path, catalog, value, fragment):
    llm = f'\n[llm]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\nguide_points = {value}\n'
    with pytest.raises(UserError, match=fragment.replace("(", r"\(")):
        load_job(write_job(tmp_path, "bad", llm=llm), catalog)
