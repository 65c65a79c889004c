"""The second serving stack: a release bundle converted to GGUF (grpolab.serving.gguf) and served by llama.cpp
(serve_gguf.py). The conversion is checked without llama.cpp, by transformers' own GGUF loader: the file gives the
bundle's logits (float64, tight), its tokenization of a chat prompt, its chat template and end ids -- and without
the Q/K permutation it does not, so the test can fail. The tests that serve the file need llama-cpp-python
(`make install-gguf`) and are skipped, saying so, where it is not importable."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpolab.errors import GrpolabError
from grpolab.gate.base import FAIL, NA, PASS, WARN
from grpolab.gate.release import check_serving_consistency
from grpolab.gate.thresholds import Thresholds
from grpolab.report.evidence import load_release_evidence
from grpolab.serving.check import (
    SERVE_GGUF_SCRIPT,
    SERVING_GGUF_FILE,
    STACKS,
    run_serving_check,
    run_serving_checks,
    serve_with_llama_cpp,
)
from grpolab.serving.gguf import convert_to_gguf, end_id_fields, pre_tokenizer_name, weights_against_gguf

T = Thresholds()
HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
needs_llama_cpp = pytest.mark.skipif(
    not HAS_LLAMA_CPP,
    reason="llama-cpp-python is not installed (`make install-gguf` builds it from source, about 15 min on 2 cores)",
)
MESSAGES = [
    [{"role": "user", "content": "What is 12 + 7? Answer with a number: 19."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  Spaces, 1234 and café 😀"}],
]


def gguf_of(model_dir: str, tmp_path: Path, outtype: str, **kw) -> Path:
    """Convert into a directory of its own: transformers reads a GGUF's tokenizer config from the directory's
    tokenizer_config.json when there is one, so the file is loaded back alone."""
    out = tmp_path / outtype / "model.gguf"
    convert_to_gguf(Path(model_dir), out, outtype, **kw)
    return out


def logits_of(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def chat_ids(tokenizer, messages) -> list[int]:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"
    ]


def bundle_and_gguf_logits(model_dir: str, path: Path, round_to=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of the bundle (float64; its 2-D weights rounded to `round_to` first) and of the GGUF file loaded by
    transformers (float64) on a chat prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if round_to is not None:
        with torch.no_grad():
            for p in ref.parameters():
                if p.dim() == 2:
                    p.copy_(p.to(round_to).float())
    ref = ref.to(torch.float64).eval()
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float64).eval()
    ids = chat_ids(AutoTokenizer.from_pretrained(model_dir), MESSAGES[0])
    return logits_of(ref, ids), logits_of(loaded, ids)


def test_an_f32_gguf_gives_the_bundles_logits_tokens_template_and_end_ids(tiny_model_dir, tmp_path, one_thread):
    from transformers import AutoTokenizer

    path = gguf_of(tiny_model_dir, tmp_path, "f32")
    ours, theirs = bundle_and_gguf_logits(tiny_model_dir, path)
    assert (ours - theirs).abs().max().item() < 1e-10  # the same float32 weights, computed in float64
    bundle_tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    gguf_tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for messages in MESSAGES:
        assert chat_ids(gguf_tok, messages) == chat_ids(bundle_tok, messages)
    assert gguf_tok.chat_template == bundle_tok.chat_template
    assert (
        (gguf_tok.eos_token, gguf_tok.bos_token, gguf_tok.pad_token)
        == (bundle_tok.eos_token, bundle_tok.bos_token, bundle_tok.pad_token)
        == ("<|im_end|>", "<|im_start|>", "<|im_end|>")
    )
    import gguf

    fields = gguf.GGUFReader(str(path)).fields
    assert fields["tokenizer.ggml.pre"].contents() == "gpt-2" and fields["tokenizer.ggml.eos_token_id"].contents() == 2
    assert fields["tokenizer.ggml.add_bos_token"].contents() is False  # the template writes <|im_start|> itself


def test_a_bf16_gguf_holds_the_bundle_weights_rounded_to_bf16(tiny_model_dir, tmp_path, one_thread):
    import gguf

    path = gguf_of(tiny_model_dir, tmp_path, "bf16")
    ours, theirs = bundle_and_gguf_logits(tiny_model_dir, path, round_to=torch.bfloat16)
    assert (ours - theirs).abs().max().item() < 1e-10
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert kinds["blk.0.attn_q.weight"] == "BF16" and kinds["blk.0.attn_norm.weight"] == "F32"  # norms stay f32
    assert path.stat().st_size < 0.7 * gguf_of(tiny_model_dir, tmp_path, "f32").stat().st_size


def test_an_f16_gguf_holds_the_bundle_weights_rounded_to_f16(tiny_model_dir, tmp_path, one_thread):
    ours, theirs = bundle_and_gguf_logits(
        tiny_model_dir, gguf_of(tiny_model_dir, tmp_path, "f16"), round_to=torch.float16
    )
    assert (ours - theirs).abs().max().item() < 1e-10


def test_without_the_qk_permutation_the_logits_differ(tiny_model_dir, tmp_path, one_thread):
    """The test above can fail: the file written without llama.cpp's Q/K row permutation loads and runs, but
    transformers' loader undoes a permutation that was never done, and the attention is wrong."""
    good, bad = bundle_and_gguf_logits(tiny_model_dir, gguf_of(tiny_model_dir, tmp_path, "f32", permute=False))
    assert (good - bad).abs().max().item() > 1e-4


def test_the_evaluated_weights_are_compared_tensor_by_tensor(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    path = gguf_of(tiny_model_dir, tmp_path, "bf16")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    w = weights_against_gguf(model, path, torch.float32)
    assert (
        w["identical"] == w["tensors"] == 20 and not w["missing"] and not w["only_in_bundle"]
    )  # tied: no output.weight
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.add_(0.01)
    w = weights_against_gguf(model, path, torch.float32)
    assert w["identical"] == 19 and 0 < w["max_abs_diff"] < 0.1


def test_end_ids_go_to_eos_eot_eom_and_more_are_refused(tiny_model_dir, tmp_path):
    import gguf

    assert end_id_fields([0, 2], 2, "g") == {"eos": 2, "eot": 0}
    with pytest.raises(GrpolabError, match="at most three"):
        end_id_fields([1, 2, 3, 4], 2, "g")
    copy = tmp_path / "two-ends"
    shutil.copytree(tiny_model_dir, copy)
    gen = copy / "generation_config.json"
    gen.write_text(json.dumps({**json.loads(gen.read_text()), "eos_token_id": [2, 0]}))
    fields = gguf.GGUFReader(str(gguf_of(str(copy), tmp_path, "f32"))).fields
    assert (
        fields["tokenizer.ggml.eos_token_id"].contents() == 2 and fields["tokenizer.ggml.eot_token_id"].contents() == 0
    )


def test_an_unsupported_architecture_or_pre_tokenizer_is_refused_by_name(tiny_model_dir, tmp_path):
    copy = tmp_path / "gpt2"
    shutil.copytree(tiny_model_dir, copy)
    config = copy / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(GrpolabError, match=r"GPT2LMHeadModel.*handles LlamaForCausalLM only"):
        convert_to_gguf(copy, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    assert pre_tokenizer_name(byte_level) == "gpt-2"
    assert (
        pre_tokenizer_name(
            {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level]}
        )
        == "smollm"
    )
    with pytest.raises(GrpolabError, match="supported: ByteLevel"):
        pre_tokenizer_name({"type": "Metaspace", "replacement": "_"})


def test_the_gguf_serving_script_cannot_import_grpolab(tmp_path):
    code = f"import runpy; runpy.run_path({str(SERVE_GGUF_SCRIPT)!r}, run_name='probe')['refuse_grpolab'](); import grpolab"
    proc = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "runs without grpolab code" in proc.stderr


def test_without_llama_cpp_the_gguf_stack_says_how_to_install(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(GrpolabError, match="make install-gguf"):
        run_serving_check(tmp_path, stack="gguf")
    with pytest.raises(GrpolabError, match="make install-gguf"):
        serve_with_llama_cpp(tmp_path / "m.gguf", [], 8)


def served(identical: float, stops: dict, ci_high: float = 0.1, gguf: bool = True) -> dict:
    """A serving JSON as check.py writes it, for the grading rules alone."""
    return {
        "chat_template": {"run": "a", "served": "a"},
        "prompts_identical": 1.0,
        "stop_ids": stops,
        "weights": {"tensors": 3, "identical": 3, "missing": []},
        "n": 40,
        "identical_share": identical,
        "first_divergence": {"median": 3},
        "logprob_diff": {"mean": 0.02},
        "precision": {"bundle": "bf16", "evaluated": "float32", "written": "float32"},
        "truncated": {"served": 0.0},
        "bundle": "b",
        "served": {"stack": {"llama_cpp": "0.3.36", "transformers": "5"}},
        "metric": {"evaluated": 0.6, "served": 0.6, "diff": {"mean": 0.0, "ci_low": -0.1, "ci_high": ci_high}},
        **({"gguf": {"type": "bf16"}} if gguf else {}),
    }


def test_the_gguf_stack_is_graded_in_serving_consistency_and_na_when_not_run(tmp_path):
    ok = {"run": [2], "served": [0, 2], "declared": [2]}
    c = check_serving_consistency(None, T, served(1.0, ok))
    assert (
        c.status == PASS and "llama.cpp also ends on ids [0]" in c.reason and "transformers: N/A, not run" in c.reason
    )
    assert c.numbers["transformers"] == "N/A: not run" and c.numbers["gguf_identical"] == 1.0
    plain = served(1.0, {"run": [2], "served": [2]}, gguf=False)
    c = check_serving_consistency(plain, T)
    assert c.status == PASS and "GGUF via llama.cpp: N/A, not run" in c.reason and c.numbers["gguf"] == "N/A: not run"
    assert check_serving_consistency(plain, T, served(0.5, ok)).status == WARN  # the worse stack decides
    dropped = check_serving_consistency(plain, T, served(1.0, {"run": [2], "served": [0], "declared": [0]}))
    assert dropped.status == FAIL and "the GGUF file declares [0]" in dropped.reason
    assert "does not end generation on [2]" in dropped.reason
    assert check_serving_consistency(None, T, None).status == NA
    assert load_release_evidence(tmp_path)["serving_gguf"] is None


@pytest.fixture(scope="module")
def gguf_run(tiny_model_dir, tmp_path_factory, one_thread) -> Path:
    from test_release import make_run

    from grpolab.serving.bundle import write_release

    run = make_run(tmp_path_factory.mktemp("gguf-runs"), tiny_model_dir, lora=False)
    write_release(run, run / "release" / "bundle")
    return run


@needs_llama_cpp
@pytest.mark.parametrize("outtype", ["f32", "bf16"])
def test_llama_cpp_serves_the_bundle_as_it_was_evaluated(gguf_run, outtype):
    s = run_serving_check(gguf_run / "release" / "bundle", threads=1, stack="gguf", gguf_type=outtype)
    assert s["served"]["stack"]["grpolab_modules"] == [] and s["served"]["stack"]["isolated"]
    assert s["served"]["stack"]["chat_format"] == "chat_template.default"  # the file's own template
    assert s["prompts_identical"] == 1.0 and s["stop_ids"]["declared"] == [2] and 2 in s["stop_ids"]["served"]
    assert s["weights"]["identical"] == s["weights"]["tensors"] > 0 and s["precision"]["bundle"] == outtype
    assert s["logprob_diff"]["tokens"] > 0 and s["logprob_diff"]["mean"] < (1e-3 if outtype == "f32" else 0.1)
    assert json.loads((gguf_run / "release" / SERVING_GGUF_FILE).read_text())["gguf"]["type"] == outtype
    c = check_serving_consistency(None, T, load_release_evidence(gguf_run)["serving_gguf"])
    assert c.status != FAIL, c.reason


@needs_llama_cpp
def test_llama_cpp_needs_the_qk_permutation_too(tiny_model_dir, tmp_path, one_thread):
    """Served by llama.cpp itself, the file without the permutation scores the same tokens otherwise."""
    ids = [1, 100, 200, 300, 2]
    request = [{"uid": "u", "messages": MESSAGES[0], "reference_ids": ids}]
    good = serve_with_llama_cpp(gguf_of(tiny_model_dir, tmp_path / "good", "f32"), request, 4, threads=1)["rows"][0]
    bad = serve_with_llama_cpp(gguf_of(tiny_model_dir, tmp_path / "bad", "f32", permute=False), request, 4, threads=1)[
        "rows"
    ][0]
    assert good["prompt_ids"] == bad["prompt_ids"]
    assert max(abs(a - b) for a, b in zip(good["reference_logprobs"], bad["reference_logprobs"])) > 1e-4


@needs_llama_cpp
def test_both_stacks_share_one_grpolab_evaluation(gguf_run, monkeypatch):
    import grpolab.serving.check as check

    calls = []
    real = check.grpolab_side
    monkeypatch.setattr(check, "grpolab_side", lambda *a, **k: calls.append(a) or real(*a, **k))
    out = run_serving_checks(gguf_run / "release" / "bundle", STACKS, threads=1)
    assert len(calls) == 1 and set(out) == {"transformers", "gguf"}
    assert out["transformers"]["stack"] == "transformers" and out["gguf"]["stack"] == "llama.cpp"
    assert out["transformers"]["n"] == out["gguf"]["n"] and out["gguf"]["prompts_identical"] == 1.0
    evidence = load_release_evidence(gguf_run)
    assert evidence["serving"]["stack"] == "transformers" and evidence["serving_gguf"]["stack"] == "llama.cpp"
