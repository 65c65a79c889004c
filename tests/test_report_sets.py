"""Evidence over seeds as a first-class object (issue 34): `grpolab report` on a set of runs (one verdict over runs
and problems), `grpolab eval` on several runs of one recipe, `grpolab compare --set` between two recipes, and the
eval's progress lines and wide tables in a log (issue 26). Synthetic run directories; no model, except the tiny
model of the progress test."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_report import BASE, STEPS, eval_json, make_run, pattern
from typer.testing import CliRunner

from grpolab.cli import app
from grpolab.errors import GrpolabError
from grpolab.evaluation.heldout import add_sets
from grpolab.evaluation.intervals import paired_interval
from grpolab.evaluation.sets import set_mean
from grpolab.gate.noninferiority import apply_waivers
from grpolab.gate.verdict import verdict
from grpolab.report import ReportOptions, build_report
from grpolab.report.build import set_report_dir

N = 80


def seeded_run(root: Path, name: str, seed: int, trained: list[bool], lr: float = 5e-6) -> Path:
    """A run of the test recipe with its seed and its own held-out answers (the base is the same for every run)."""
    run = make_run(root, name, config={"train": {"steps": STEPS, "lr": lr, "seed": seed}})
    ckpt = run / "checkpoints" / f"step-{STEPS}"
    data = eval_json("arithmetic", [(BASE, BASE, pattern(0.3)), (str(run), str(ckpt), trained)])
    (run / "eval" / "base_vs_trained.json").write_text(json.dumps(data))
    return run


def gains(trained: list[list[bool]]) -> list[float]:
    base = np.array(pattern(0.3), float)
    return [float(np.mean(np.array(t, float) - base)) for t in trained]


def better(seed: int) -> list[bool]:
    return [b or x for b, x in zip(pattern(0.3), pattern(0.6, seed=seed))]


def test_set_report_judges_the_set_not_one_lucky_run(tmp_path):
    worse = [False] * N  # one seed forgot everything: alone, its report FAILs
    answers = [better(11), better(12), worse]
    runs = [seeded_run(tmp_path, f"qs-seed{i}", i, a) for i, a in enumerate(answers)]
    alone = build_report(runs[2], ReportOptions())
    assert next(c for c in alone["checks"] if c.name == "heldout_improvement").status == "FAIL"
    rep = build_report(runs, ReportOptions())
    d = rep["heldout"]["diff"]
    per_run = gains(answers)
    assert d["hierarchical"] and d["runs"] == 3 and d["n"] == N
    assert d["mean"] == pytest.approx(np.mean(per_run)) and list(d["per_run"].values()) == pytest.approx(per_run)
    assert d["spread"]["min"] == pytest.approx(min(per_run)) and d["ci_low"] < 0 < d["ci_high"]  # the runs disagree
    improvement = next(c for c in rep["checks"] if c.name == "heldout_improvement")
    assert improvement.status == "WARN" and rep["verdict"][0] == "not established"  # the set's evidence, not run 2's
    assert rep["paths"]["html"].parent == tmp_path / "qs-set" == set_report_dir(runs)
    md = (tmp_path / "qs-set" / "report.md").read_text()
    assert "## Runs of this set" in md and "qs-seed2" in md and "between runs" in md
    page = (tmp_path / "qs-set" / "report.html").read_text()
    assert '<section id="set">' in page and "a between-seed part, each with its own degrees of freedom" in page


def test_set_of_agreeing_runs_ships_and_its_interval_is_that_of_the_pooled_runs(tmp_path):
    runs = [seeded_run(tmp_path, f"a{i}", i, better(11)) for i in range(3)]  # identical answers: no run spread
    rep = build_report(runs, ReportOptions(out=tmp_path / "out"))
    one = build_report(runs[0], ReportOptions())
    # issue 60: no capability problem and no safety prompt changed (exact intervals +-0.07 on 50, +-0.116 on 30):
    # non-inferiority at 0.05 is not shown, so the set ships only once the user waives both (it shipped before)
    label, why = rep["verdict"]
    assert label == "not established" and "capability gsm8k: low end" in why and "safety: increase high end" in why
    waived = verdict(apply_waivers(rep["checks"], ["capability", "safety"]))
    assert waived[0] == "ship", [(c.name, c.status, c.reason) for c in rep["checks"]]
    d, d1 = rep["heldout"]["diff"], one["heldout"]["diff"]
    pooled = paired_interval(np.array(pattern(0.3), float), np.array(better(11), float))  # one run's t interval
    assert d["mean"] == pytest.approx(d1["mean"]) and d["runs"] == 3 and d["n"] == N
    assert (d["mean"], d["ci_low"], d["ci_high"]) == pytest.approx(
        (pooled["mean"], pooled["ci_low"], pooled["ci_high"]), abs=1e-12
    )
    div = next(c for c in rep["checks"] if c.name == "pass_at_k_diversity")
    assert div.status == "PASS" and "of 3 runs" in div.numbers["source"]
    assert (tmp_path / "out" / "report.html").is_file()


def test_set_report_refuses_runs_of_different_recipes_and_baselines(tmp_path):
    runs = [seeded_run(tmp_path, "r0", 0, better(11)), seeded_run(tmp_path, "r1", 1, better(12), lr=1e-4)]
    with pytest.raises(GrpolabError, match=r"r1: not a seed of the same recipe as r0 .*config.train.lr"):
        build_report(runs, ReportOptions())
    with pytest.raises(GrpolabError, match="--baseline: applies to the report of one run"):
        build_report(runs, ReportOptions(baselines=["base"]))


def test_set_report_refuses_runs_evaluated_on_different_problems(tmp_path):
    """One run of 80 problems and one of 3 used to become n = 3 (+1.000 [1.000, 1.000] PASS); now refused, naming both."""
    runs = [seeded_run(tmp_path, "p-seed0", 0, better(11)), seeded_run(tmp_path, "p-seed1", 1, better(12))]
    small = json.loads((runs[1] / "eval" / "base_vs_trained.json").read_text())
    for m in small["models"]:
        m["items"] = m["items"][:3]
    (runs[1] / "eval" / "base_vs_trained.json").write_text(json.dumps(small))
    with pytest.raises(GrpolabError, match=r"p-seed0 \(80 problems\) and p-seed1 \(3 problems\).*align='intersect'"):
        build_report(runs, ReportOptions(skip_safety=True))


def test_compare_sets_refuses_runs_decoded_differently_and_lists_what_it_skips(tmp_path):
    a = [seeded_run(tmp_path, f"d{i}", i, better(11 + i)) for i in range(2)]
    b = [seeded_run(tmp_path, f"e{i}", i, [True] * N, lr=1e-4) for i in range(2)]
    other = json.loads((a[1] / "eval" / "base_vs_trained.json").read_text())
    (a[1] / "eval" / "base_vs_trained.json").write_text(json.dumps({**other, "max_new_tokens": 64}))
    res = CliRunner().invoke(app, ["compare", "--set", f"a={a[0]},{a[1]}", "--set", f"b={b[0]},{b[1]}"])
    assert isinstance(res.exception, GrpolabError), res.output
    assert "d0 and d1 were not evaluated the same way (max_new_tokens: 48 vs 64)" in str(res.exception)
    from grpolab.report.compare import named_sets

    (a[1] / "eval" / "base_vs_trained.json").write_text(json.dumps(other))
    ckpt = a[1] / "checkpoints" / f"step-{STEPS}"  # one run of set a also has an eval the other lacks
    extra = eval_json("extra", [(BASE, BASE, pattern(0.3)), (str(a[1]), str(ckpt), better(3))])
    (a[1] / "eval" / "extra.json").write_text(json.dumps(extra))
    got = named_sets({"a": a, "b": b})
    assert [(k["set"], k["data_hash"]) for k in got["skipped"]] == [("a", "x-extra")]
    assert "1 rows for the set's 2 runs" in got["skipped"][0]["reason"]
    held_out = [e for s in got["sets"] for e in s["eval_sets"] if e["task"] == "arithmetic" and e["method"] == "greedy"]
    assert [e["n"] for e in held_out] == [N, N] and got["set_differences"][0]["n"] == N  # every result says n


def test_cli_report_takes_several_runs(tmp_path):
    runs = [seeded_run(tmp_path, f"c-seed{i}", i, better(11 + i)) for i in range(2)]
    res = CliRunner().invoke(app, ["report", *map(str, runs), "--skip-safety", "--out", str(tmp_path / "set")])
    assert res.exit_code == 0, res.output
    assert "c-seed0:" in res.output and "verdict:" in res.output and (tmp_path / "set" / "report.md").is_file()


# ---------------------------------------------------------------- grpolab eval / compare on sets


def row(name: str, scores: list[float], manifest: Path | None = None) -> dict:
    return {
        "model": name,
        "items": [{"uid": f"u{i}", "scores": {"accuracy": s}} for i, s in enumerate(scores)],
        "held_out": {"checked": manifest is not None, "manifest": str(manifest) if manifest else None},
    }


def test_eval_rows_of_one_recipe_form_a_set(tmp_path):
    def manifest(name: str, seed: int, lr: float = 1e-5) -> Path:
        path = tmp_path / name / "manifest.json"
        path.parent.mkdir()
        path.write_text(
            json.dumps({"grpolab_manifest": 1, "seed": seed, "config": {"train": {"seed": seed, "lr": lr}}})
        )
        return path

    rows = [
        row("base", [0, 0, 1, 1]),
        row("s0", [1, 0, 1, 1], manifest("s0", 0)),
        row("other", [1, 1, 1, 1], manifest("o", 5, 1.0)),
        row("s1", [1, 1, 1, 1], manifest("s1", 1)),
        row("hub", [0, 0, 0, 0]),
    ]
    sets = add_sets(rows)
    assert [(s["runs"], s["seeds"], s["reference"]) for s in sets] == [(["s0", "s1"], [0, 1], "base")]
    gain = sets[0]["metrics"]["accuracy"]["gain"]
    assert gain["per_run"] == [0.25, 0.5] and gain["mean"] == pytest.approx(0.375)
    expected = set_mean([[1, 0, 0, 0], [1, 1, 0, 0]])
    assert (gain["ci_low"], gain["ci_high"]) == (expected["ci_low"], expected["ci_high"])


def test_compare_two_sets_reports_the_difference_of_means(tmp_path):
    a = [seeded_run(tmp_path, f"a{i}", i, better(11 + i)) for i in range(2)]
    b = [seeded_run(tmp_path, f"b{i}", i, [True] * N, lr=1e-4) for i in range(2)]
    out = tmp_path / "cmp.json"
    res = CliRunner().invoke(
        app, ["compare", "--set", f"a={a[0]},{a[1]}", "--set", f"b={b[0]},{b[1]}", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    diff = next(d for d in data["set_differences"] if d["method"] == "greedy")["metrics"]["accuracy"]
    acc_a = np.mean([np.mean(better(11)), np.mean(better(12))])
    assert diff["mean"] == pytest.approx(1.0 - acc_a) and diff["b"]["spread"]["std"] == 0.0
    assert diff["a"]["runs"] == diff["b"]["runs"] == 2 and diff["n"] == N
    # two seeds of A whose accuracies differ measure the between-seed variance with about one degree of freedom: the
    # interval is wide (t quantile 12.7 at 1 df), as it must be with two seeds
    a_means = diff["a"]["per_run"]
    assert a_means[0] != a_means[1] and diff["df"] < 3 and diff["ci_low"] < 0 < diff["mean"] < diff["ci_high"]
    set_a = next(s for s in data["sets"] if s["name"] == "a")
    greedy = next(e for e in set_a["eval_sets"] if e["method"] == "greedy")
    assert greedy["metrics"]["accuracy"]["gain"]["per_run"] == pytest.approx(gains([better(11), better(12)]))
    assert "b - a on arithmetic" in res.output and "difference of means" in res.output
    # the seeds of each recipe are also found without --set, with their hierarchical evidence
    assert CliRunner().invoke(app, ["compare", *map(str, a + b), "--out", str(out)]).exit_code == 0
    groups = json.loads(out.read_text())[
        "seed_groups"
    ]  # per recipe: held-out and capability (greedy), diversity (sampled)
    assert sorted(g["runs"][0] for g in groups if g["evidence"]) == ["a0", "a0", "a0 sampled", "b0", "b0", "b0 sampled"]
    bad = CliRunner().invoke(app, ["compare", "--set", "a"])
    assert isinstance(bad.exception, GrpolabError) and "NAME=SOURCE" in str(bad.exception)


def test_eval_prints_progress_lines_and_wide_tables_in_a_log(tiny_model_dir):
    """CliRunner's stdout is not a terminal: one line per batch with problems done and elapsed seconds, and a
    table wider than 80 columns kept on one line per row."""
    args = [
        "eval",
        tiny_model_dir,
        tiny_model_dir,
        "--task",
        "arithmetic",
        "--task-option",
        "digits=1",
        "--limit",
        "3",
        "--max-new-tokens",
        "3",
        "--batch-size",
        "2",
        "--samples",
        "2",
        "--dtype",
        "float32",
    ]
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    # (a line can share its start with the weights' loading bar, written to stderr with a carriage return)
    progress = [line[line.index("eval /") :] for line in lines if "eval /" in line and " problems, " in line]
    assert any(" greedy: 2/3 problems, " in line and line.endswith("s") for line in progress), progress
    assert any(" 2 samples: 3/3 problems, " in line for line in progress), progress
    header = next(line for line in lines if "accuracy [95% CI]" in line)
    assert "problems/s" in header and "pass@2" in header and len(header) > 80
