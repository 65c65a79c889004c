"""The release bundle and its serving / rollback checks (grpolab.serving, grpolab.gate.release) on a tiny model:
a clean bundle serves what was evaluated; planted faults -- a LoRA exported without its merge, the wrong chat
template, the end-of-turn id dropped from generation_config.json, a bf16 bundle of an fp32 model, a rollback target
whose weights changed -- are caught, each by the measurement that names it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpolab.errors import GrpolabError
from grpolab.evaluation.heldout import run_eval
from grpolab.gate.base import FAIL, NA, PASS
from grpolab.gate.release import check_rollback_ready, check_serving_consistency
from grpolab.gate.thresholds import Thresholds
from grpolab.manifest import hash_model_dir, problem_hashes, sha256_bytes, write_json_atomic
from grpolab.report.evidence import load_release_evidence
from grpolab.serving.bundle import read_release, write_release
from grpolab.serving.check import SERVE_SCRIPT, run_serving_check, serve_with_transformers
from grpolab.serving.rollback import run_rollback_check
from grpolab.tasks import make_task

T = Thresholds()
OPTIONS = {"num_train": 20, "num_test": 6}
MAX_NEW = 12
ROLLOUT = {"temperature": 0.7, "top_p": 0.95, "top_k": 0, "max_new_tokens": MAX_NEW, "stop_rule": "auto"}


def _checkpoint(model, tokenizer, path: Path) -> None:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    torch.save({"step": 1}, path / "trainer_state.pt")


def make_run(root: Path, base: str, lora: bool) -> Path:
    """A run directory as `grpolab train` + `grpolab eval` leave it: manifest, one checkpoint (the base with its
    weights moved, or a LoRA adapter with non-zero B) and eval/base_vs_trained.json on 6 held-out problems."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = root / ("lora" if lora else "full")
    ckpt = run / "checkpoints" / "step-1"
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    if lora:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    else:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=gen))
    _checkpoint(model, tokenizer, ckpt)
    task = make_task("arithmetic", **OPTIONS)
    manifest = {
        "grpolab_manifest": 1,
        "config": {"model": {"name": base}, "task": {"name": "arithmetic", "options": OPTIONS}, "rollout": ROLLOUT},
        "objective": {"preset": "grpo", "formula": "J(theta) = ..."},
        "precision": {"update": "fp32"},
        "hashes": {
            "model_weights": hash_model_dir(base)["weights"],
            "chat_template": sha256_bytes(tokenizer.chat_template.encode()),
        },
        "model_path": base,
        "train_problem_hashes": problem_hashes(task.problems("train")),
    }
    write_json_atomic(run / "manifest.json", manifest)
    result = run_eval([base, str(run)], "arithmetic", OPTIONS, "test", 0, MAX_NEW, 8, "float32")
    (run / "eval").mkdir()
    write_json_atomic(run / "eval" / "base_vs_trained.json", result)
    return run


@pytest.fixture(scope="module")
def full_run(tiny_model_dir, tmp_path_factory, one_thread) -> Path:
    return make_run(tmp_path_factory.mktemp("runs"), tiny_model_dir, lora=False)


@pytest.fixture(scope="module")
def bundle(full_run) -> Path:
    return write_release(full_run, full_run / "release" / "bundle")


def planted(bundle: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    return copy


def test_the_bundle_carries_the_runs_template_end_ids_sampling_and_evidence(full_run, bundle):
    release = read_release(bundle)
    gen = json.loads((bundle / "generation_config.json").read_text())
    tokenizer_eos = json.loads((bundle / "tokenizer_config.json").read_text()).get("eos_token")
    assert gen["eos_token_id"] == [2] and tokenizer_eos == "<|im_end|>"  # SmolLM2's end of turn
    # the run's sampling, not transformers' defaults (top_k 50 would cut what the run sampled from)
    assert (gen["do_sample"], gen["temperature"], gen["top_p"], gen["top_k"], gen["max_new_tokens"]) == (
        True,
        0.7,
        0.95,
        0,
        MAX_NEW,
    )
    manifest = json.loads((full_run / "manifest.json").read_text())
    assert release["hashes"]["chat_template"] == manifest["hashes"]["chat_template"]
    assert release["hashes"]["weights"] == hash_model_dir(str(bundle))["weights"]
    assert release["hashes"]["checkpoint_weights"] == hash_model_dir(release["checkpoint"])["weights"]
    evaluated = json.loads((full_run / "eval" / "base_vs_trained.json").read_text())["models"][1]
    assert release["held_out"]["accuracy"] == evaluated["accuracy"] and release["held_out"]["n"] == 6
    assert release["precision"] == {"written": "float32", "evaluated": "float32", "trained": {"update": "fp32"}}
    assert release["objective"]["preset"] == "grpo" and release["stop_rule"] == "none"
    held = json.loads((bundle / "heldout.json").read_text())
    assert [it["completion"] for it in held["items"]] == [it["completion"] for it in evaluated["items"]]
    with pytest.raises(GrpolabError, match="not empty"):
        write_release(full_run, bundle)


def test_a_run_without_a_held_out_evaluation_is_not_released(full_run, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(full_run, bare, ignore=shutil.ignore_patterns("eval", "release"))
    with pytest.raises(GrpolabError, match="no held-out evaluation"):
        write_release(bare, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_serving_script_cannot_import_grpolab(tmp_path):
    code = f"import runpy; runpy.run_path({str(SERVE_SCRIPT)!r}, run_name='probe')['refuse_grpolab'](); import grpolab"
    proc = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "runs without grpolab code" in proc.stderr
    ok = subprocess.run([sys.executable, "-I", "-c", "import grpolab"], cwd=tmp_path, capture_output=True, timeout=60)
    assert ok.returncode == 0  # ... while grpolab is installed in that interpreter: the refusal is what stops it


def _end_id_some_answers_reach(bundle: Path, requests: list[dict]) -> int:
    """Give `bundle` weights whose greedy answers vary (the tiny model's repeat one token), then return a token
    the answers to the first five requests (one prompt length, no end id) write at some position >= 1 in some and
    nowhere in others: made the end id, it ends rows of one batch at different steps."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bundle)
    model = AutoModelForCausalLM.from_pretrained(bundle, dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(bundle)
    answers = []
    for r in requests:
        prompt = tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, return_dict=True)["input_ids"]
        ids = torch.tensor([prompt])
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=MAX_NEW,
            eos_token_id=None,
            pad_token_id=0,
            temperature=None,
            top_p=None,
            top_k=None,
        )
        answers.append(out[0, ids.shape[1] :].tolist())
    batch = answers[:5]  # the requests of one prompt length (the test's first five)
    counts = {t: sum(t in a[1:-1] for a in batch) for a in batch for t in a[1:-1]}
    some = [t for t, c in sorted(counts.items()) if 0 < c < len(batch)]
    assert some, answers
    return some[0]


def test_served_batches_answer_as_one_at_a_time(full_run, bundle, tmp_path):
    """Requests of one prompt length answered together by serve_hf.py give the tokens and logprobs of one at a
    time, in request order, with rows ending at different steps cut after their end id. Logprobs agree to float32
    rounding of products of another row count (1.5e-5 seen; a row mix-up would differ by O(1)); the greedy
    choices here have a top-2 logit gap of at least 3e-3, far above that rounding."""
    questions = [f"What is {a} + {b}?" for a, b in ((11, 12), (13, 14), (15, 16), (17, 18), (19, 10))] + [
        "Please add the numbers 1, 2, 3, 4 and 5 together."
    ]
    requests = [
        {"uid": str(i), "messages": [{"role": "user", "content": q}], "reference_ids": [5, 6, 7]}
        for i, q in enumerate(questions)
    ]
    planted = shutil.copytree(bundle, tmp_path / "bundle")
    end = _end_id_some_answers_reach(planted, requests)
    path = planted / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "eos_token_id": [end]}))
    one = serve_with_transformers(planted, requests, MAX_NEW, threads=1, batch_size=1)
    together = serve_with_transformers(planted, requests, MAX_NEW, threads=1, batch_size=3)
    lengths = [len(r["prompt_ids"]) for r in one["rows"]]
    assert lengths[:5] == [lengths[0]] * 5 and lengths[5] != lengths[0]  # two batches of equal length, and one alone
    assert [r["uid"] for r in together["rows"]] == [str(i) for i in range(6)] and together["batch_size"] == 3
    assert 0 < sum(r["stopped"] for r in one["rows"][:5]) < 5  # rows of one batch end at different steps
    for a, b in zip(one["rows"], together["rows"]):
        assert a["completion_ids"] == b["completion_ids"] and a["stopped"] == b["stopped"] and a["text"] == b["text"]
        assert not a["stopped"] or a["completion_ids"].count(end) == 1 and a["completion_ids"][-1] == end
        assert b["logprobs"] == pytest.approx(a["logprobs"], rel=1e-4, abs=1e-4) and len(a["logprobs"]) == len(
            a["completion_ids"]
        )
        assert b["reference_logprobs"] == pytest.approx(a["reference_logprobs"], rel=1e-4, abs=1e-4)


@pytest.mark.slow  # over 20 s on a loaded 2-core CPU: two serving processes
def test_a_clean_bundle_serves_what_was_evaluated(full_run, bundle):
    s = run_serving_check(bundle)
    assert s["served"]["stack"]["grpolab_modules"] == [] and s["served"]["stack"]["isolated"]
    assert s["prompts_identical"] == 1.0 and s["stop_ids"] == {"run": [2], "served": [2]}
    assert s["weights"]["identical"] == s["weights"]["tensors"] > 0
    assert s["identical_share"] == 1.0 and s["first_divergence"] is None
    assert s["logprob_diff"]["mean"] < 1e-4 and s["logprob_diff"]["tokens"] > 0
    assert s["metric"]["diff"] == {"mean": 0.0, "ci_low": 0.0, "ci_high": 0.0}
    c = check_serving_consistency(load_release_evidence(full_run)["serving"], T)
    assert c.status == PASS, c.reason
    r = run_rollback_check(full_run, n=4)
    rollback = check_rollback_ready(r, T)
    assert rollback.status == PASS, rollback.reason
    assert r["command"] == f"transformers serve {r['path']}" and r["command"] in rollback.reason


@pytest.mark.slow  # over 20 s on a loaded 2-core CPU: two serving processes
def test_a_lora_exported_without_its_merge_fails(tiny_model_dir, tmp_path, one_thread):
    run = make_run(tmp_path, tiny_model_dir, lora=True)
    good = write_release(run, tmp_path / "good")
    assert read_release(good)["lora_merged"] is True
    assert check_serving_consistency(run_serving_check(good), T).status == PASS
    bad = planted(good, tmp_path)
    shutil.copy(Path(tiny_model_dir) / "model.safetensors", bad / "model.safetensors")  # the base, adapter dropped
    s = run_serving_check(bad)
    c = check_serving_consistency(s, T)
    assert c.status == FAIL and "weights differ from the evaluated model" in c.reason
    assert s["logprob_diff"]["mean"] > 0.01  # the served model is not the evaluated one, token by token


def test_the_wrong_chat_template_fails(full_run, bundle, tmp_path):
    bad = planted(bundle, tmp_path)
    template = bad / "chat_template.jinja"
    template.write_text(template.read_text().replace("You are a helpful AI assistant", "You are a pirate"))
    s = run_serving_check(bad)
    c = check_serving_consistency(s, T)
    assert s["prompts_identical"] == 0.0
    assert c.status == FAIL and "chat template differs" in c.reason and "served prompts differ" in c.reason


def test_an_end_of_turn_id_dropped_from_generation_config_fails(full_run, bundle, tmp_path):
    bad = planted(bundle, tmp_path)
    path = bad / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "eos_token_id": []}))
    s = run_serving_check(bad)
    c = check_serving_consistency(s, T)
    assert c.status == FAIL and "end ids differ" in c.reason and s["stop_ids"]["served"] == []
    assert s["truncated"]["served"] == 1.0  # nothing ends an answer but the token bound


def test_a_bf16_bundle_of_an_fp32_model_is_measured_not_failed(full_run, tmp_path):
    bf16 = write_release(full_run, tmp_path / "bf16", dtype="bfloat16")
    s = run_serving_check(bf16)
    c = check_serving_consistency(s, T)
    assert s["precision"] == {"bundle": "bfloat16", "evaluated": "float32"}
    assert s["weights"]["identical"] == s["weights"]["tensors"]  # the evaluated weights, rounded to bf16 exactly
    assert s["logprob_diff"]["mean"] > 1e-4 and "mean_abs_dlogp" in c.numbers  # the divergence is measured, shown
    assert c.status != FAIL and s["metric"]["diff"]["ci_high"] >= 0  # and the metric did not drop


def test_a_served_metric_drop_fails_and_divergence_alone_warns():
    s = {
        "chat_template": {"run": "a", "served": "a"},
        "prompts_identical": 1.0,
        "stop_ids": {"run": [2], "served": [2]},
        "weights": {"tensors": 3, "identical": 3},
        "n": 40,
        "identical_share": 0.5,
        "first_divergence": {"median": 3},
        "logprob_diff": {"mean": 0.02},
        "precision": {"bundle": "bfloat16", "evaluated": "float32"},
        "truncated": {"served": 0.0},
        "bundle": "b",
        "served": {"stack": {"transformers": "5"}},
        "metric": {"evaluated": 0.6, "served": 0.6, "diff": {"mean": 0.0, "ci_low": -0.1, "ci_high": 0.1}},
    }
    assert check_serving_consistency(s, T).status == "WARN"
    assert check_serving_consistency(s, T.replace({"serving_divergence_warn": 0.6})).status == PASS
    s["metric"] = {"evaluated": 0.6, "served": 0.4, "diff": {"mean": -0.2, "ci_low": -0.3, "ci_high": -0.1}}
    c = check_serving_consistency(s, T)
    assert c.status == FAIL and "served accuracy is lower" in c.reason


def test_not_run_is_na_never_pass(tmp_path):
    evidence = load_release_evidence(tmp_path)
    for c in (check_serving_consistency(evidence["serving"], T), check_rollback_ready(evidence["rollback"], T)):
        assert c.status == NA and "grpolab release" in c.reason


@pytest.mark.slow  # over 20 s on a loaded 2-core CPU: two serving processes
def test_a_rollback_target_whose_weights_changed_fails(full_run, bundle, tmp_path):
    previous = planted(bundle, tmp_path)  # a previous release, rolled back to
    assert check_rollback_ready(run_rollback_check(full_run, str(previous), n=4), T).status == PASS
    with (previous / "model.safetensors").open("r+b") as f:  # one byte of the weights flipped after the release
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    c = check_rollback_ready(run_rollback_check(full_run, str(previous), n=4), T)
    assert c.status == FAIL and "weights changed" in c.reason
