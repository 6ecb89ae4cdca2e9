"""Several models in one job, and where a replay's report goes, against loopback servers (the real
openai client over HTTP): new requests are shared by weight, a repair goes to the model that wrote
the failed answer, every stored call names the model and endpoint that served it, per-model
statistics add up, each endpoint gets its own key (stored nowhere); ``--llm replay`` into another
database writes its report next to that database, never over the original's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm_server import BROKEN, FAST, Reply, ScriptedServer, fenced
from llm_toy import FIXTURES, run_llm_search, write_llm_job

pytestmark = pytest.mark.interpreter

KEY_A = "sk-kfmodels-KEYA-1234567890ab"
KEY_B = "sk-kfmodels-KEYB-abcdef012345"

def write_job(folder: Path, name: str, *, evaluations: int, max_calls: int, tables: str = "", **llm) -> Path:
    return write_llm_job(folder, name, evaluations=evaluations, seed=1, tables=tables, max_calls=max_calls,
                         tune_evaluations=1, response_tokens=3000, **llm)


def test_two_models_share_the_requests_by_weight_and_repairs_return_to_their_author(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_MODELS_KEY_A", KEY_A)
    monkeypatch.setenv("KF_MODELS_KEY_B", KEY_B)
    # Model a writes the broken kernel first (its repair must come back to a), b a prose answer.
    a_script = [Reply(fenced(BROKEN), label="broken"), Reply(fenced(FAST), label="repaired"),
                Reply("No more ideas.", label="prose-a")]
    b_script = [Reply("I would use larger blocks.", label="prose-b"), Reply("Nothing else.", label="prose-b2")]
    with ScriptedServer(a_script) as a, ScriptedServer(b_script) as b:
        a_url, b_url = a.base_url, b.base_url
        llm = f"""token_limit_field = "max_completion_tokens"
[llm.extra_body]
num_ctx = 16384

[[llm.models]]
model = "model-a"
base_url = "{a.base_url}"
api_key_env = "KF_MODELS_KEY_A"

[[llm.models]]
model = "model-b"
base_url = "{b.base_url}"
api_key_env = "KF_MODELS_KEY_B"
temperature = 0.3
"""
        path = write_job(tmp_path, "multi", evaluations=6, max_calls=4, tables=llm)
        store, _, outcome = run_llm_search(path, tmp_path / "multi.db")
    assert set(a.auth) == {f"Bearer {KEY_A}"} and set(b.auth) == {f"Bearer {KEY_B}"}, "each endpoint its own key"
    assert all(r["model"] == "model-a" and "temperature" not in r for r in a.requests)
    assert all(r["model"] == "model-b" and r["temperature"] == 0.3 for r in b.requests)
    assert all(r["num_ctx"] == 16384 and r["max_completion_tokens"] == 3000 for r in a.requests + b.requests)
    calls = store.llm_calls("multi")
    served = {"model-a": a_url, "model-b": b_url}
    assert calls and all(c.base_url == served[c.model] for c in calls), "each row names who served it"
    new = [c.model for c in calls if c.final and c.purpose == "new"]
    assert new[:2] == ["model-b", "model-a"], "equal weights alternate (the job's seed 1 starts at the second)"
    # Each model's first answer failed (a compile error, prose): its repair turn went to that model.
    for model in ("model-a", "model-b"):
        assert [c.purpose for c in calls if c.final and c.model == model][:2] == ["new", "repair"], model
    assert a.served[:2] == ["broken", "repaired"] and b.served[:2] == ["prose-b", "prose-b2"]
    assert "broken" not in b.served and "repaired" in a.served
    stats = {s.model: s for s in store.llm_model_stats("multi")}
    assert set(stats) == {"model-a", "model-b"}
    assert stats["model-a"].requests == len(a.requests) and stats["model-b"].requests == len(b.requests)
    assert sum(s.requests for s in stats.values()) == len([c for c in calls if c.final])
    assert dict(stats["model-b"].outcomes) == {"no_code": len(b.requests)}
    assert stats["model-a"].prompt_tokens > 0 and stats["model-a"].median_latency_s is not None
    assert outcome.llm["models"] == {f"model-a @ {a_url}": len(a.requests), f"model-b @ {b_url}": len(b.requests)}
    db = (tmp_path / "multi.db").read_bytes()
    assert KEY_A.encode() not in db and KEY_B.encode() not in db


def test_a_replay_into_another_database_writes_its_report_next_to_it(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-m", "kernelforge", "--kernels", str(FIXTURES)]
    with ScriptedServer([Reply(fenced(FAST), label="fast"), Reply("No more ideas.")]) as server:
        path = write_job(tmp_path, "rep", evaluations=3, max_calls=2, base_url=server.base_url, model="m")
        live = subprocess.run([*cli, "search", str(path), "--progress", "quiet", "--no-compile"], cwd=tmp_path,
                              capture_output=True, text=True, env=env, timeout=600)
    assert live.returncode == 0, live.stderr
    original = tmp_path / "reports" / "rep"
    before = {f.name: f.read_bytes() for f in original.iterdir() if f.is_file() and f.suffix != ".db"}
    assert "REPORT.md" in before
    other = tmp_path / "elsewhere" / "replayed.db"
    other.parent.mkdir()
    again = subprocess.run([*cli, "search", str(path), "--llm", f"replay:{original / 'kernelforge.db'}",
                            "--storage", f"sqlite:///{other}", "--progress", "quiet", "--no-compile"],
                           cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr
    after = {f.name: f.read_bytes() for f in original.iterdir() if f.is_file() and f.suffix != ".db"}
    assert after == before, "the original search's report is untouched"
    replay_report = other.parent / "replayed-report" / "REPORT.md"
    assert replay_report.is_file() and "rep" in replay_report.read_text()
    assert str(replay_report.relative_to(tmp_path)) in " ".join(again.stdout.split() + again.stderr.split())
