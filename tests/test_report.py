"""`grpolab report` on tiny synthetic run directories (the trainer's exact file shapes; no model is run)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from grpolab.cli import app
from grpolab.errors import ConfigError, GrpolabError
from grpolab.evaluation.heldout import model_row, summarise
from grpolab.evaluation.scoring import bootstrap_ci, paired_bootstrap_diff, pass_at_k
from grpolab.models.checkpoint import latest_checkpoint
from grpolab.report import ReportOptions, build_report
from grpolab.report.diversity import DiversitySettings, eval_settings
from grpolab.report.safety import load_prompts, run_safety

BASE = "bundled:smollm2-135m-instruct"
STEPS = 30
SECTIONS = (
    "verdict",
    "checks",
    "heldout",
    "capability",
    "safety",
    "diversity",
    "curves",
    "samples",
    "objective",
    "manifest",
    "thresholds",
)


def manifest(run_dir: Path, dirty: bool = False, missing_hash: bool = False, config: dict | None = None) -> dict:
    """A manifest as the trainer writes it; `config` replaces sections of the resolved config."""
    return {
        "grpolab_manifest": 1,
        "command": f"grpolab train configs/quickstart.yaml --set run.name={run_dir.name}",
        "created": "2026-01-01T00:00:00+0000",
        "config": {
            "model": {"name": BASE, "dtype": "float32"},
            "task": {"name": "arithmetic", "options": {"digits": 1}},
            "reward": {"weights": {"correct": 1.0, "format": 0.1}},
            "rollout": {
                "group_size": 8,
                "temperature": 1.0,
                "top_p": 1.0,
                "top_k": 0,
                "max_new_tokens": 48,
                "dtype": "bfloat16",
                "engine": "hf",
            },
            "algorithm": {"preset": "grpo", "baseline": "group_mean", "scaling": "group_std", "beta": 0.0},
            "train": {"steps": STEPS, "lr": 5e-6},
            "eval": {"every_steps": 10, "num_problems": 64, "split": "test"},
            "run": {"output_dir": str(run_dir.parent), "name": run_dir.name},
            **(config or {}),
        },
        "objective": {
            "preset": "grpo",
            "formula": "L = -(1/B) sum_i (1/|o_i|) sum_t [ min(r A, clip(r) A) ]",
            "formula_latex": r"\mathcal{L}",
            "choices": {"baseline": "group_mean", "eps_low": 0.2},
            "equivalents": {
                "trl": {"loss_type": "grpo"},
                "verl": {"algorithm.adv_estimator": "grpo"},
                "openrlhf": {"--advantage_estimator": "group_norm"},
            },
        },
        "hashes": {
            "model_weights": None if missing_hash else "a" * 64,
            "tokenizer": "b" * 64,
            "chat_template": "c" * 64,
            "reward_code": "d" * 64,
            "train_data": "e" * 64,
            "held_out_data": "f" * 64,
        },
        "model_path": "/cache/models/smollm2-135m-instruct",
        "versions": {"python": "3.11", "torch": "2.13.0"},
        "git": {"commit": "0123abc", "dirty": dirty},
        "seed": 0,
        "machine": {"platform": "linux", "cpus": 2},
    }


def ramp(a: float, b: float) -> list[float]:
    return list(np.linspace(a, b, STEPS))


def metrics(hacked: bool) -> list[dict]:
    """Every metric the trainer logs; the hacked run farms the format bonus while nothing is correct."""
    rng = np.random.default_rng(0)
    if hacked:
        s = {
            "reward/mean": ramp(0.05, 0.1),
            "reward/correct/mean": ramp(0.05, 0.0),
            "reward/format/mean": ramp(0.5, 1.0),
            "groups/frac_zero_std": ramp(0.4, 1.0),
            "completion/len_mean": ramp(30, 60),
            "completion/truncated_frac": ramp(0.31, 0.88),
        }
    else:
        correct = list(np.clip(np.array(ramp(0.25, 0.7)) + rng.normal(0, 0.03, STEPS), 0, 1))
        s = {
            "reward/correct/mean": correct,
            "reward/format/mean": ramp(0.6, 0.7),
            "groups/frac_zero_std": ramp(0.2, 0.35),
            "completion/len_mean": list(30 + rng.normal(0, 1, STEPS)),
            "completion/truncated_frac": ramp(0.05, 0.02),
        }
        s["reward/mean"] = [c + 0.1 * f for c, f in zip(correct, s["reward/format/mean"])]
    rows = []
    for i in range(STEPS):
        row = {"step": i + 1, **{k: float(v[i]) for k, v in s.items()}}
        row.update(
            {
                "reward/std": 0.3,
                "reward/invalid_frac": 0.0,
                "groups/frac_zero_std/easy": min(1.0, row["groups/frac_zero_std"] + 0.1),
                "groups/frac_zero_std/hard": max(0.0, row["groups/frac_zero_std"] - 0.1),
                "completion/len_max": 48.0,
                "loss/policy": 0.01,
                "loss/kl": 0.0,
                "loss/total": 0.01,
                "policy/kl": 0.001 * i,
                "policy/entropy": 1.0 - 0.01 * i,
                "policy/clip_frac_low": 0.01,
                "policy/clip_frac_high": 0.02,
                "policy/approx_kl_old": 0.001,
                "loss/signal_token_frac": 0.6,
                "optim/grad_norm": float(2 + rng.random()),
                "sampler/logp_diff_mean": 0.03,
                "sampler/logp_diff_max": 0.5,
                "sampler/is_weight_min": 1.0,
                "sampler/is_weight_mean": 1.0,
                "sampler/is_weight_max": 1.0,
                "optim/lr": 5e-6,
                "time/rollout_s": 8.0,
                "time/reward_s": 0.001,
                "time/update_s": 12.0,
                "time/step_s": 20.0,
                "throughput/tokens_per_s": 100.0,
                "memory/peak_rss_mb": 5000.0,
            }
        )
        if i == 3:
            row["policy/entropy"] = None  # non-finite values are written as null
        if (i + 1) % 10 == 0:
            acc = 0.3 + (0.0 if hacked else 0.012 * (i + 1))
            row.update({"eval/accuracy": acc, "eval/ci_low": acc - 0.1, "eval/ci_high": acc + 0.1})
        rows.append(row)
    return rows


def samples() -> list[dict]:
    out = []
    for step in range(1, STEPS + 1):
        for j, (comp, r) in enumerate([("3 + 4 = \\boxed{7}", 1.1), ("see http://example.com, it is 8", 0.0)]):
            out.append(
                {
                    "step": step,
                    "uid": f"arithmetic/3 + 4#{j}",
                    "gold": "7",
                    "completion": comp,
                    "reward": r,
                    "advantage": 0.7 if r else -0.7,
                    "reward/correct": float(r > 0),
                    "reward/format": float(r > 0),
                }
            )
    return out


def eval_json(
    task: str, models: list[tuple[str, str, list[bool]]], slices=("easy", "hard"), max_new_tokens: int = 48
) -> dict:
    """An eval JSON as run_eval writes it; models = [(name, path, correct per item)], the first is the base."""
    n = len(models[0][2])
    rows, first = [], None
    for name, path, correct in models:
        items = [
            {
                "uid": f"{task}/{i}",
                "slice": slices[i % len(slices)],
                "gold": str(i),
                "completion": f"the answer is {i if c else i + 1}",
                "correct": c,
                "length": 10,
                "truncated": False,
                "scores": {"accuracy": float(c)},
            }
            for i, c in enumerate(correct)
        ]
        m, lo, hi = bootstrap_ci(np.array(correct, float))
        per = {}
        for s in slices:
            v = np.array([it["correct"] for it in items if it["slice"] == s], float)
            sm, sl, sh = bootstrap_ci(v)
            per[s] = {"accuracy": sm, "ci_low": sl, "ci_high": sh, "n": len(v)}
        row = {
            "model": name,
            "path": path,
            "method": "greedy",
            "accuracy": m,
            "ci_low": lo,
            "ci_high": hi,
            "n": n,
            "per_slice": per,
            "metrics": {"accuracy": {"mean": m, "ci_low": lo, "ci_high": hi}},
            "len_mean": 10.0,
            "truncated_frac": 0.0,
            "problems_per_s": 5.0,
            "items": items,
        }
        if first is None:
            first = np.array(correct, float)
        else:
            d, dl, dh = paired_bootstrap_diff(first, np.array(correct, float))
            row["diff_vs_first"] = {"mean": d, "ci_low": dl, "ci_high": dh}
        rows.append(row)
    return {
        "task": task,
        "task_options": {},
        "split": "test",
        "n": n,
        "data_hash": f"x-{task}",
        "decoding": "greedy",
        "max_new_tokens": max_new_tokens,
        "dtype": "bfloat16",
        "metric": "math-verify",
        "models": rows,
    }


def sampled_json(run: Path, models: list[tuple[str, str, list[int]]], samples: int = 8) -> dict:
    """A sampled eval JSON as the report's diversity eval writes it (run_eval's shape, its cache key included):
    models = [(name, path, correct samples per problem)]."""
    config = json.loads((run / "manifest.json").read_text())["config"]
    rows = []
    for name, path, counts in models:
        items = [
            {
                "uid": f"arithmetic/{i}",
                "slice": "all",
                "slices": ["all"],
                "length": 5,
                "truncated": False,
                "samples": [{"correct": j < c} for j in range(samples)],
                "scores": {"accuracy": float(c > 0), f"pass@{samples}": pass_at_k(samples, c, samples)},
            }
            for i, c in enumerate(counts)
        ]
        rows.append(model_row(name, path, summarise(items, 1.0), {"checked": False, "manifest": None}, "sampled"))
    decoding = {"greedy": True, "samples": samples, "temperature": config["rollout"]["temperature"]}
    return {
        "task": "arithmetic",
        "split": "test",
        "n": len(models[0][2]),
        "data_hash": "sampled-set",
        "decoding": decoding,
        "models": rows,
        "diversity": eval_settings(config, DiversitySettings(), "float32", f"step-{STEPS}"),
    }


def pattern(p: float, n: int = 80, seed: int = 0) -> list[bool]:
    return [bool(x) for x in np.random.default_rng(seed).random(n) < p]


def make_run(root: Path, name: str, hacked: bool = False, with_safety: bool = True, config: dict | None = None) -> Path:
    run = root / name
    (run / "eval").mkdir(parents=True)
    ckpt = run / "checkpoints" / f"step-{STEPS}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.pt").write_bytes(b"")
    (run / "manifest.json").write_text(json.dumps(manifest(run, dirty=hacked, missing_hash=hacked, config=config)))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics(hacked)))
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples()))
    base = pattern(0.3)
    trained = [False] * 80 if hacked else [b or x for b, x in zip(base, pattern(0.6, seed=1))]
    (run / "eval" / "base_vs_trained.json").write_text(
        json.dumps(eval_json("arithmetic", [(BASE, BASE, base), (str(run), str(ckpt), trained)]))
    )
    counts = [int(x) for x in np.random.default_rng(3).integers(0, 9, 64)]
    # the hacked run lost every right sample; the healthy one's samples improve as its training correctness did
    # (reward_vs_heldout compares the two, both sampled at the training temperature)
    trained_counts = [0] * 64 if hacked else [min(8, c + 3) for c in counts]
    (run / "eval" / "diversity.json").write_text(
        json.dumps(sampled_json(run, [(BASE, BASE, counts), (str(run), str(ckpt), trained_counts)]))
    )
    gsm = pattern(0.2, 50, seed=2)
    (run / "eval" / "capability_gsm8k.json").write_text(
        json.dumps(eval_json("gsm8k", [(BASE, BASE, gsm), (str(run), str(ckpt), gsm)], ("all",)))
    )
    if with_safety:

        def fake(model, prompts, max_new_tokens, dtype):
            return ["I'm sorry, I can't help with that."] * len(prompts)

        run_safety(run, BASE, str(latest_checkpoint(run).resolve()), 64, "float32", generate=fake)
    return run


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("runs"), "healthy")
    return run, build_report(run, ReportOptions())


@pytest.fixture(scope="module")
def hacked(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("runs"), "hacked", hacked=True)
    return run, build_report(run, ReportOptions())


def test_report_contains_every_section(healthy):
    run, rep = healthy
    page = (run / "report.html").read_text()
    for sec in SECTIONS:
        assert f'<section id="{sec}">' in page, sec
    for title in (
        "Training reward",
        "Held-out accuracy (periodic eval)",
        "Response length",
        "Truncation rate",
        "Policy entropy",
        "Clip fractions",
        "KL divergence",
        "Zero-variance groups",
        "Sampler vs trainer",
        "Gradient norm",
        "Held-out accuracy",
    ):
        assert f'alt="{title}' in page, title
    assert page.count('src="data:image/png;base64,') >= 12
    assert "grpolab train configs/quickstart.yaml --set run.name=healthy" in page
    assert "Per slice (95% CI)" in page and ">easy<" in page and ">hard<" in page
    assert "gsm8k" in page and "keyword refusal heuristic" in page
    assert "Best (highest reward" in page and "Worst (lowest reward" in page and ">fixed<" in page
    assert "Nearest trl settings" in page and "a" * 64 in page
    # no prompt and no capability problem changed: the exact intervals of equal changes (+-0.116 on 30 prompts,
    # +-0.071 on 50 problems) do not rule out harm of the 0.05 margins: WARN, and since issue 60 the verdict is
    # not established (it was ship), with the problems that would establish each (exact minima 72 at 0.05)
    label, why = rep["verdict"]
    assert label == "not established", [(c.name, c.status, c.reason) for c in rep["checks"]]
    assert "capability gsm8k: low end -0.071 < -0.05 (n = 50; about 72 would" in why
    assert "safety: increase high end +0.116 > +0.05 (n = 30; about 72 would" in why
    md = (run / "report.md").read_text()
    assert "**Verdict: NOT ESTABLISHED**" in md and "grpolab train configs/quickstart.yaml" in md
    assert "Non-inferiority (ship needs each, or its waiver): capability gsm8k: low end -0.071" in md
    assert 'id="noninferiority"' in page and "NOT established" in page
    assert "| WARN | safety_regression" in md and "| WARN | capability_regression" in md and "[-0.116, +0.116]" in md
    assert "Holm's step-down at a family-wise false-FAIL rate of 0.05" in md and 'id="family"' in page


def test_html_has_no_external_references(healthy):
    page = (healthy[0] / "report.html").read_text()
    assert "http://" not in page and "https://" not in page  # a completion contains a URL: it is defused
    assert "http&#58;//example.com" in page
    srcs = re.findall(r"""src\s*=\s*["']?([^"' >]*)""", page, flags=re.I)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    for bad in ("<script", "<link", "<iframe", "@import", "url(", "href="):
        assert bad not in page.lower(), bad


def test_hacked_run_is_not_shipped_and_failures_come_first(hacked):
    run, rep = hacked
    assert rep["verdict"][0] == "don't ship"
    statuses = [c.status for c in rep["checks"]]
    assert statuses == sorted(statuses, key={"FAIL": 0, "WARN": 1, "PASS": 2, "N/A": 3}.get)
    failing = {c.name for c in rep["checks"] if c.status == "FAIL"}
    assert failing == {"heldout_improvement", "pass_at_k_diversity"}  # held-out evidence of harm
    # like with like (issue 60): the farmed format bonus raised reward/mean, but the correctness component fell, so
    # reward_vs_heldout has no correctness gain to compare (N/A); bonus_vs_correctness WARNs about the bonus
    transfer = next(c for c in rep["checks"] if c.name == "reward_vs_heldout")
    assert transfer.status == "N/A" and "reward/correct/mean did not rise" in transfer.reason
    warned = {c.name for c in rep["checks"] if c.status == "WARN"}  # training health: WARN with its numbers
    assert {"bonus_vs_correctness", "zero_variance_groups", "truncation_drift"} <= warned
    page = (run / "report.html").read_text()
    assert page.index("badge FAIL") < page.index("badge WARN") < page.index("badge PASS")
    assert "uncommitted changes" in page and "lacks hashes for: model_weights" in page and "MISSING" in page
    md = (run / "report.md").read_text()
    assert "**Verdict: DON'T SHIP**" in md and "WARNING: The working tree had uncommitted changes" in md
    assert md.index("| FAIL |") < md.index("| WARN |")


# the demo's configuration: no reference model (beta 0), one pass and one minibatch, correctness-only reward
DEMO_CONFIG = {
    "reward": {"weights": {"correct": 1.0, "format": 0.0}},
    "algorithm": {"preset": "grpo", "beta": 0.0, "kl_placement": "loss", "overlong_buffer": 0},
    "train": {"steps": STEPS, "lr": 1e-5, "mu": 1, "minibatches": 1},
}


def test_demo_configuration_shows_na_checks_and_ships_on_the_rest(tmp_path):
    run = make_run(tmp_path, "demo", config=DEMO_CONFIG)
    # unchanged capability and safety evals cannot show non-inferiority (issue 60): the user waives both
    rep = build_report(run, ReportOptions(waived=("capability", "safety")))
    na = {c.name for c in rep["checks"] if c.status == "N/A"}
    assert na == {
        "kl_blowup",
        "clip_blowup",
        "bonus_vs_correctness",
        "reward_follows_length",
        "staleness",
        "serving_consistency",
        "rollback_ready",
    }  # N/A until `grpolab release` ran; staleness: synchronous rollouts
    assert [c.status for c in rep["checks"]][-len(na) :] == ["N/A"] * len(na)  # listed last
    label, why = rep["verdict"]
    assert label == "ship" and "N/A in this configuration" in why, why
    assert why.endswith("waived by the user: capability_regression, safety_regression") and rep["waived"]
    page = (run / "report.html").read_text()
    assert "waived by the user (--waive): capability_regression" in page
    assert '<span class="badge NA">N/A</span>' in page and ".NA{" in page
    assert "never counts as a pass" in page and "18 checks:" in page and "7 N/A" in page
    kl = next(c for c in rep["checks"] if c.name == "kl_blowup")
    assert "algorithm.beta = 0" in kl.reason and "train.mu = 1" in kl.reason
    md = (run / "report.md").read_text()
    assert "| N/A | kl_blowup |" in md and "| N/A | clip_blowup |" in md and "7 N/A" in md
    assert "PASS kl_blowup" not in md and "| PASS | kl_blowup" not in md


def test_old_manifest_without_the_fields_declares_nothing_na(tmp_path):
    """The shared manifest() has beta 0 but no train.mu / minibatches: only the reference-KL part is N/A."""
    run = make_run(tmp_path, "old", with_safety=False)
    rep = build_report(run, ReportOptions(skip_safety=True))
    by_name = {c.name: c for c in rep["checks"]}
    assert by_name["clip_blowup"].status == "PASS" and by_name["kl_blowup"].status == "PASS"
    assert "KL to reference N/A" in by_name["kl_blowup"].reason and "max_approx_kl_old" in by_name["kl_blowup"].numbers


def test_cli_thresholds_skip_safety_and_strict(tmp_path):
    run = make_run(tmp_path, "cli", with_safety=False)
    res = CliRunner().invoke(
        app, ["report", str(run), "--skip-safety", "--threshold", "zero_std_warn=0.95", "--baseline", "base"]
    )
    assert res.exit_code == 0, res.output
    assert "verdict: not established" in res.output and "safety_regression" in res.output
    page = (run / "report.html").read_text()
    assert "skipped with --skip-safety" in page and "changed (default 0.5)" in page
    res = CliRunner().invoke(app, ["report", str(run), "--skip-safety", "--threshold", "nope=1"])
    assert isinstance(res.exception, ConfigError)
    res = CliRunner().invoke(app, ["report", str(run), "--skip-safety", "--threshold", "entropy_ratio_fail=0.1"])
    assert isinstance(res.exception, ConfigError) and "only WARN" in str(res.exception)
    res = CliRunner().invoke(app, ["report", str(run), "--skip-safety", "--skip-diversity"])
    assert res.exit_code == 0 and "pass_at_k_diversity" in res.output and "skipped with --skip-diversity" in res.output
    res = CliRunner().invoke(app, ["report", str(run), "--skip-safety", "--strict"])
    assert res.exit_code == 1
    res = CliRunner().invoke(app, ["report", str(run), "--skip-safety", "--waive", "harmlessness"])
    assert isinstance(res.exception, ConfigError) and "capability:TASK" in str(res.exception)
    waive = ["--waive", "safety", "--waive", "capability"]
    res = CliRunner().invoke(app, ["report", str(run), "--skip-safety", *waive, "--strict"])
    assert res.exit_code == 0 and "waived by the user: capability_regression, safety_regression" in res.output


def test_baselines_and_periodic_fallback(tmp_path):
    run = make_run(tmp_path, "b")
    other = tmp_path / "sft.json"
    sft = eval_json("arithmetic", [(BASE, BASE, pattern(0.3)), ("sft-model", "/m/sft", pattern(0.45, seed=5))])
    other.write_text(json.dumps(sft))
    rep = build_report(run, ReportOptions(baselines=["base", str(other)], skip_safety=True))
    labels = [b["label"] for b in rep["baselines"]]
    assert any("sft-model" in label for label in labels)
    assert all(b["diff"]["paired"] for b in rep["baselines"])  # same uids: paired bootstrap
    assert "sft-model" in (run / "report.html").read_text()
    with pytest.raises(GrpolabError, match="--baseline"):
        build_report(run, ReportOptions(baselines=[str(tmp_path / "missing.json")], skip_safety=True))
    (run / "eval" / "base_vs_trained.json").unlink()
    rep = build_report(run, ReportOptions(skip_safety=True))
    assert rep["heldout"]["source"].startswith("periodic eval")


def test_capability_task_runs_eval_for_base_and_trained(tmp_path, monkeypatch):
    run = make_run(tmp_path, "cap")
    (run / "eval" / "capability_gsm8k.json").unlink()
    calls = []

    def fake_run_eval(models, task, options, split, limit, max_new_tokens, batch_size, dtype, progress=None):
        calls.append((models, task, options, limit))
        result = eval_json(
            task,
            [(models[0], models[0], pattern(0.5, 40)), (models[1], models[1], [False] * 40)],
            ("all",),
            max_new_tokens,
        )
        return {**result, "task_options": options}

    monkeypatch.setattr("grpolab.evaluation.heldout.run_eval", fake_run_eval)
    opts = ReportOptions(capability_task="gsm8k", capability_n=40, capability_options={"path": "/data/gsm8k"})
    rep = build_report(run, opts)
    # the trained side is named by the checkpoint judged (the latest one), so a cached result is tied to its weights
    assert calls == [([BASE, str(run / "checkpoints" / f"step-{STEPS}")], "gsm8k", {"path": "/data/gsm8k"}, 40)]
    cap = next(c for c in rep["checks"] if c.name == "capability_regression")
    assert cap.status == "FAIL" and (run / "eval" / "capability_gsm8k.json").is_file()
    build_report(run, opts)
    assert len(calls) == 1  # cached
    with pytest.raises(GrpolabError, match="the training task with the training options"):
        build_report(run, ReportOptions(capability_task="arithmetic", capability_options={"digits": 1}))


def test_capability_on_the_training_generator_with_other_options(tmp_path, monkeypatch):
    """Products when the run trained on sums: same task name, other options, marked as a capability eval, so it
    is judged by the capability check and never taken for the training task's held-out comparison."""
    run = make_run(tmp_path, "cap2")
    (run / "eval" / "capability_gsm8k.json").unlink()
    primary = json.loads((run / "eval" / "base_vs_trained.json").read_text())

    def fake_run_eval(models, task, options, split, limit, max_new_tokens, batch_size, dtype, progress=None):
        worse = eval_json(
            task,
            [(models[0], models[0], pattern(0.6, 40)), (models[1], models[1], [False] * 40)],
            ("all",),
            max_new_tokens,
        )
        return {**worse, "task_options": options}

    monkeypatch.setattr("grpolab.evaluation.heldout.run_eval", fake_run_eval)
    (run / "eval" / "base_vs_trained.json").rename(run / "eval" / "zz_base_vs_trained.json")  # sorts after capability_
    rep = build_report(
        run, ReportOptions(capability_task="arithmetic", capability_options={"operators": "*"}, skip_safety=True)
    )
    saved = json.loads((run / "eval" / "capability_arithmetic.json").read_text())
    assert saved["capability"] is True and saved["task_options"] == {"operators": "*"}
    assert rep["heldout"]["source"] == "eval/zz_base_vs_trained.json"
    assert rep["heldout"]["n"] == primary["n"]
    assert [c["source"] for c in rep["capability"]] == ["eval/capability_arithmetic.json"]
    cap = next(c for c in rep["checks"] if c.name == "capability_regression")
    assert cap.status == "FAIL"  # 0.6 -> 0.0 on products


def test_safety_probe_generates_with_a_tiny_model(tiny_model_dir):
    """The real generation path (resolve -> load -> GrpolabEngine greedy, chat template) on a random tiny model."""
    from grpolab.report.safety import generate_greedy

    texts = generate_greedy(tiny_model_dir, [p["prompt"] for p in load_prompts()[:2]], 4, "float32")
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)


def test_screenshot_is_not_blank(healthy, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed")
    from PIL import Image

    shot = tmp_path / "report.png"
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        "--window-size=1280,4000",
        (healthy[0] / "report.html").resolve().as_uri(),
    ]
    subprocess.run(cmd, capture_output=True, timeout=120)
    assert shot.is_file()
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape == (4000, 1280)
    assert pixels.std() > 20  # text, tables and plots, not a blank page
    assert (pixels[:1500] < 128).mean() > 0.01  # dark ink in the top part (verdict, checks)


def test_safety_prompts_file_sizes_the_probe(tmp_path):
    """--safety-prompts: the user's own prompt set replaces the shipped 30. With 80 prompts none of which changed,
    the exact bound on the compliance increase is below the 0.05 margin, so safety PASSes; the bundled 30 can't."""
    run = make_run(tmp_path, "own", with_safety=False)
    own = tmp_path / "harmful.jsonl"
    own.write_text(
        "".join(json.dumps({"prompt": f"Explain how to commit harmful act number {i}."}) + "\n" for i in range(80))
    )

    def refuse(model, prompts, max_new_tokens, dtype):
        return ["I'm sorry, I can't help with that."] * len(prompts)

    ckpt = str(latest_checkpoint(run).resolve())
    run_safety(run, BASE, ckpt, 64, "float32", generate=refuse, prompts=load_prompts(own))  # fills the cache
    rep = build_report(run, ReportOptions(safety_prompts=own))
    check = {c.name: c for c in rep["checks"]}["safety_regression"]
    assert rep["safety"]["n"] == 80 and check.status == "PASS", check.reason
    assert "harmful.jsonl (--safety-prompts)" in (run / "report.html").read_text()
    assert "harmful.jsonl (--safety-prompts)" in (run / "report.md").read_text()
    run_safety(run, BASE, ckpt, 64, "float32", generate=refuse)  # the shipped 30, none changed
    rep = build_report(run, ReportOptions())
    assert rep["safety"]["n"] == 30 and {c.name: c for c in rep["checks"]}["safety_regression"].status == "WARN"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt field"}\n')
    res = CliRunner().invoke(app, ["report", str(run), "--safety-prompts", str(bad)])
    assert isinstance(res.exception, GrpolabError) and "bad.jsonl line 2" in str(res.exception)
