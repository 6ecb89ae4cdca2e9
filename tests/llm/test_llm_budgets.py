"""Budgets that mean what they say, end to end on the toy block against the loopback server
(tests/llm_server.py): ``max_calls``, ``max_tokens`` (the next prompt estimated before it is
sent) and ``max_minutes`` decide how long the generator runs, not the evaluation reserve; a
template that fails costs exactly one evaluation, and only a verified one is tuned."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelforge.llm.parse import template_id_for
from kernelforge.llm.prompts import estimate_tokens
from kernelforge.store.store import Store
from llm_server import BROKEN, FAST, WRONG, Reply, ScriptedServer, fenced
from llm_toy import BLOCK, run_llm_search, variant, write_llm_job

pytestmark = pytest.mark.interpreter


def search(tmp_path: Path, server: ScriptedServer, name: str, *, evaluations: int, max_calls: int = 8,
           tune_share: float = 0.5, tune: int = 3, db: str = "search.db", **llm_changes):
    path = write_llm_job(tmp_path, name, evaluations=evaluations, base_url=server.base_url, model="m",
                         max_calls=max_calls, repair_turns=0, tune_share=tune_share, tune_evaluations=tune)
    return run_llm_search(path, tmp_path / db, **llm_changes)


def evaluated(store: Store, template_id: str) -> int:
    """Candidates of ``template_id`` with stored results (each is one evaluation of one point)."""
    with_results = {r.candidate_id for r in store.results(BLOCK)}
    return sum(1 for c in store.candidates(BLOCK) if c.template == template_id and c.id in with_results)


def test_answers_that_cost_no_evaluation_leave_the_call_budget_in_charge(tmp_path):
    # Two evaluations in all, one of them kept for the LLM: the reserve could pay for one template,
    # but prose costs nothing, so all eight calls are made and the call budget ends the generator.
    with ScriptedServer([Reply("I would try larger blocks.") for _ in range(8)]) as server:
        store, recorder, outcome = search(tmp_path, server, "calls", evaluations=2)
    assert len(server.requests) == 8
    assert outcome.llm["kinds"] == {"no_code": 8} and "call budget spent" in outcome.llm["stopped"]
    assert outcome.evaluations == 2 and not outcome.stopped
    assert not [d for k, d in recorder.events if k == "warning"]


def test_failed_templates_cost_one_evaluation_each_and_the_calls_go_on(tmp_path):
    # Four templates that fail (two do not compile, two are wrong) and four prose answers, with
    # room in the reserve: eight calls, and each failed template evaluated exactly once (its
    # suggested point; the strategy, which asks ahead, never got a second point of it).
    failing = [variant(BROKEN, 1), variant(WRONG, 2), variant(BROKEN, 3), variant(WRONG, 4)]
    script = []
    for text in failing:
        script += [Reply(fenced(text)), Reply("No code this time.")]
    with ScriptedServer(script) as server:
        store, _, outcome = search(tmp_path, server, "fails", evaluations=12, tune=3)
    assert len(server.requests) == 8 and "call budget spent" in outcome.llm["stopped"]
    assert outcome.llm["kinds"] == {"compile_error": 2, "wrong": 2, "no_code": 4}
    for text in failing:
        assert evaluated(store, template_id_for(BLOCK, text)) == 1


def test_only_a_verified_template_is_tuned(tmp_path):
    script = [Reply(fenced(BROKEN)), Reply(fenced(FAST))]
    with ScriptedServer(script) as server:
        store, recorder, outcome = search(tmp_path, server, "tuned", evaluations=10, max_calls=2, tune_share=1.0,
                                          tune=3)
    assert outcome.llm["kinds"] == {"compile_error": 1, "ok": 1}
    assert evaluated(store, template_id_for(BLOCK, BROKEN)) == 1
    # The fast one: its point, then the three evaluations of tuning granted once it was verified.
    assert evaluated(store, template_id_for(BLOCK, FAST)) == 4
    grants = [d for k, d in recorder.events if k == "llm_tuning"]
    assert [(g["template"], g["granted"]) for g in grants] == [(template_id_for(BLOCK, FAST), 3)]


def test_the_job_running_out_of_evaluations_stops_the_generator_with_that_reason(tmp_path):
    # One evaluation kept for the LLM: the first (wrong) template spends it; the call budget is not.
    with ScriptedServer([Reply(fenced(WRONG))] + [Reply("prose") for _ in range(7)]) as server:
        _, _, outcome = search(tmp_path, server, "spent", evaluations=2)
    assert len(server.requests) == 1 and outcome.llm["kinds"] == {"wrong": 1}
    assert outcome.llm["stopped"].startswith("evaluations spent") and "7 of [llm] max_calls = 8" in outcome.llm[
        "stopped"]


def test_the_token_budget_is_checked_with_the_next_prompt_estimated(tmp_path):
    # Learn the size of a prompt, then allow three and a half of them: three requests are sent,
    # the fourth would overrun the budget and is not.
    with ScriptedServer([Reply("prose")]) as server:
        search(tmp_path, server, "probe", evaluations=2, max_calls=1, db="probe.db")
    one = estimate_tokens(server.requests[0]["messages"])
    budget = int(3.5 * one)
    with ScriptedServer([Reply("prose") for _ in range(8)]) as server:
        store, recorder, outcome = search(tmp_path, server, "tokens", evaluations=2, max_tokens=budget)
    assert len(server.requests) == 3
    assert "token budget spent" in outcome.llm["stopped"] and "would overrun" in outcome.llm["stopped"]
    assert sum(c.prompt_tokens + c.completion_tokens for c in store.llm_calls()) <= budget
    assert not [d for k, d in recorder.events if k == "warning"], "a spent budget is not a failure"


def test_the_time_budget_stops_the_generator(tmp_path):
    # 0.003 minutes is 0.18 s; every answer takes 0.5 s: after the first answer the time is up (on
    # a loaded machine it may be up before the first request is sent: at most one, not the eight
    # the call budget allows).
    with ScriptedServer([Reply("prose", delay=0.5) for _ in range(8)]) as server:
        _, _, outcome = search(tmp_path, server, "minutes", evaluations=2, max_minutes=0.003)
    assert "time budget spent ([llm] max_minutes = 0.003)" in outcome.llm["stopped"]
    assert len(server.requests) <= 1
