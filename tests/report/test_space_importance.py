"""Issue 32: parameter importance is Optuna's (PED-ANOVA, as optuna-dashboard computes it for the
mirrored studies), one method everywhere, and too few points give no scores and say so."""

from __future__ import annotations

import math
import random

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

from kernelforge.report.records import BlockReport, CandidateRow
from kernelforge.report.space_view import MIN_MEASURED, TOO_FEW, space_view


def _block(n: int, seed: int = 0) -> BlockReport:
    """``n`` measured candidates whose speedup is set by BLOCK alone (num_stages is noise)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        params = {"BLOCK": rng.choice([16, 32, 64, 128]), "num_stages": rng.choice([2, 3, 4])}
        speedup = params["BLOCK"] / 32 * (1 + 0.01 * rng.random())
        rows.append(CandidateRow(order=i, id=f"c{i}", template="t", origin="optuna", parent=None, status="ok",
                                 geomean_speedup=speedup, shapes=1, params=params))
    return BlockReport(block="toy/axpy", description="", shapes=(), geomean_speedup=None, statuses={}, origins={},
                       candidates=n, candidate_rows=tuple(rows))


def test_too_few_points_give_no_scores_and_say_so():
    view = space_view(_block(5))
    assert view.importance == ()
    assert TOO_FEW in view.note and "PED-ANOVA" in view.note and str(MIN_MEASURED) in view.note


def test_the_scores_are_optunas_ped_anova_of_the_same_trials():
    block = _block(40)
    view = space_view(block)
    assert view.importance[0].name == "BLOCK" and view.importance[0].share > 0.5
    # What optuna-dashboard computes for a study holding the same trials.
    dists = {"BLOCK": CategoricalDistribution([16, 32, 64, 128]), "num_stages": CategoricalDistribution([2, 3, 4])}
    study = optuna.create_study(direction="maximize")
    for c in block.candidate_rows:
        study.add_trial(optuna.trial.create_trial(params=c.params, distributions=dists,
                                                  value=math.log(c.geomean_speedup)))
    expected = get_param_importances(study, target=lambda t: -t.value, evaluator=PedAnovaImportanceEvaluator())
    assert {i.name: i.share for i in view.importance} == pytest.approx(dict(expected))


def test_interpreter_inert_parameters_are_marked():
    from dataclasses import replace

    from kernelforge.report.markdown import _block_markdown
    from kernelforge.report.records import Banner

    base = CandidateRow(order=0, id="base", template="t", origin="baseline", parent=None, status="ok",
                        geomean_speedup=1.0, shapes=1, params={"BLOCK": 32, "num_warps": 4, "num_stages": 2})
    stages = replace(base, order=1, id="stages", origin="optuna", geomean_speedup=0.3,
                     params={"BLOCK": 32, "num_warps": 4, "num_stages": 3})
    tile = replace(base, order=2, id="tile", origin="optuna", params={"BLOCK": 64, "num_warps": 4, "num_stages": 3})
    block = BlockReport(block="toy/axpy", description="", shapes=(), geomean_speedup=None, statuses={}, origins={},
                        candidates=3, candidate_rows=(base, stages, tile), baseline="base",
                        banner=Banner(kind="interpret", device_name="cpu", text="interpreter"))
    md = "\n".join(_block_markdown(block))
    assert "num_warps, num_stages cannot change the interpreter's work" in md
    marked = [line for line in md.splitlines() if "(same interpreter work as the baseline)" in line]
    assert len(marked) == 1 and "`stages`" in marked[0]
    on_gpu = "\n".join(_block_markdown(replace(block, banner=None)))
    assert "interpreter work" not in on_gpu
