"""`grpolab bench CONFIG --estimate GPU` (grpolab/training/estimate.py): the memory and time terms against a hand
count, the parameter count of Qwen3's published shapes, the GPU table's lookup, and the Qwen3 recipes' stated
estimates equal to what the command prints (their config.json built offline from the published hyperparameters)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from transformers import Qwen3Config

from grpolab.config import from_dict, load_config
from grpolab.training import estimate as est
from grpolab.training.flops import ModelShape


def run_main(monkeypatch, *args) -> int:
    """grpolab.cli.main with these arguments, in this process; its exit code."""
    import sys

    from grpolab import cli

    monkeypatch.setattr(sys, "argv", ["grpolab", *map(str, args)])
    try:
        cli.main()
    except SystemExit as e:
        return int(e.code or 0)
    return 0


CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# Qwen3-0.6B and Qwen3-1.7B as their model cards publish them (the hub's config.json, without the network)
QWEN3 = {
    "Qwen/Qwen3-0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28),
    "Qwen/Qwen3-1.7B": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28),
}


def qwen3(name: str) -> Qwen3Config:
    return Qwen3Config(
        **QWEN3[name],
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
    )


SHAPE = ModelShape(n_layers=2, d_model=10, d_attn=10, vocab=50, n_body=1000, n_head=500)
RUN = est.RunShape(prompt_len=6, completion_len=4, group_size=2, prompts=3, micro_batch=2, mu=1, reference=True)
GPU = est.GPUSpec("toy", bf16=1e9, fp32=1e8, bandwidth=1e6, memory=1e6)


def test_memory_terms_by_hand():
    """P = 1500, d_kv = 4, L = 10, rows = 6."""
    m = est.memory_bytes(SHAPE, 1500, 4, RUN)
    assert m["training_state"] == 18 * 1500 and m["reference"] == 2 * 1500
    assert m["activations"] == 2 * 10 * 2 * 34 * 10  # b x L x layers x 34 d
    assert m["logits"] == 2 * 4 * 50 * 6
    assert m["sampler"] == 2 * 1500 + 6 * 10 * 2 * 2 * 4 * 2
    assert m["total"] == pytest.approx(27000 + 3000 + 13600 + 2400 + 3000 + 1920)


def test_time_terms_by_hand():
    """The decode read: Lc x (2P + KV at L/2) / (bandwidth x share); the update: (ref + mu x policy) FLOPs over the
    peak x MFU; the sync: 2P over the measured rate."""
    s = est.step_seconds(SHAPE, 1500, 4, RUN, GPU)
    kv_mid = 6 * (6 + 2) * 2 * 2 * 4 * 2
    read = 4 * (2 * 1500 + kv_mid) / (1e6 * est.DECODE_BANDWIDTH_SHARE)
    assert s["generation"] == pytest.approx(read)  # memory-bound at this toy bandwidth
    fwd = 6 * (2 * 1000 * 9 + 2 * 500 * 4 + 4 * 2 * 10 * sum(p + 1 for p in range(9)))
    assert s["update"] == pytest.approx((fwd + 3 * fwd) / (1e9 * est.UPDATE_MFU))
    assert s["sync"] == pytest.approx(3000 / est.SYNC_BYTES_PER_S)
    assert s["total"] == pytest.approx(s["generation"] + s["update"] + s["sync"])


def test_qwen3_parameter_counts_match_the_published_sizes():
    """0.60 B and 1.72 B (the model cards: 0.6B, 1.7B; 0.44 B and 1.4 B without the embedding); the per-head q/k norms
    (2 x 128 per layer) are the only weights the Llama-style count leaves out."""
    small = est.model_sizes(qwen3("Qwen/Qwen3-0.6B"))
    large = est.model_sizes(qwen3("Qwen/Qwen3-1.7B"))
    assert small[1] == pytest.approx(0.596e9 + 28 * 256, rel=1e-3) and small[2] == 8 * 128
    assert large[1] == pytest.approx(1.7206e9 + 28 * 256, rel=1e-3)
    assert small[0].n_body == pytest.approx(0.44e9, rel=0.01) and large[0].n_body == pytest.approx(1.41e9, rel=0.01)


def test_gpu_lookup_prefers_the_specific_name_and_refuses_an_unknown_one():
    assert est.gpu_spec("NVIDIA H100 PCIe").label == "NVIDIA H100 PCIe"
    assert est.gpu_spec("NVIDIA H100 80GB HBM3").label == "NVIDIA H100 SXM"
    assert est.gpu_spec("h200").memory == 141e9
    with pytest.raises(ValueError, match="no spec sheet for the GPU 'TPU v5'; known: H200, H100 PCIe"):
        est.gpu_spec("TPU v5")


@pytest.mark.parametrize("recipe", ["gsm8k_qwen3-0.6b.yaml", "gsm8k_qwen3-1.7b.yaml"])
def test_the_qwen3_recipes_state_what_the_estimate_prints(recipe, monkeypatch, capsys):
    """The recipe's header line `step X s, memory Y GiB` equals `grpolab bench RECIPE --estimate h100
    --prompt-tokens 200` (run through the CLI, the model's config.json replaced by the published shape), and it fits
    an H100's memory, as its micro-batch was chosen to."""
    import transformers

    text = (CONFIGS / recipe).read_text()
    stated = re.search(r"one H100 SXM: step ([\d.]+) s, memory ([\d.]+) GiB", text)
    assert stated, recipe
    cfg = load_config(CONFIGS / recipe)
    assert cfg.rollout.engine == "vllm" and cfg.model.name in QWEN3
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", lambda name, **kw: qwen3(cfg.model.name))
    code = run_main(monkeypatch, "bench", CONFIGS / recipe, "--estimate", "h100", "--prompt-tokens", "200")
    out = capsys.readouterr().out
    assert code == 0, out
    printed = re.search(r"step ([\d.]+) s = .*\n\s+memory ([\d.]+) GiB of 75 \(fits in 90%\)", out)
    assert printed, out
    assert printed.groups() == stated.groups(), (out, stated.groups())


def test_an_unknown_gpu_is_one_line_naming_the_option(monkeypatch, capsys):
    code = run_main(monkeypatch, "bench", CONFIGS / "quickstart.yaml", "--estimate", "tpu")
    err = capsys.readouterr()
    assert code == 2 and "--estimate: no spec sheet for the GPU 'tpu'" in err.out + err.err


def test_the_estimate_of_the_quickstart_runs_offline_and_is_labelled(monkeypatch, capsys):
    assert from_dict({}).model.name.startswith("bundled:")
    code = run_main(monkeypatch, "bench", CONFIGS / "quickstart.yaml", "--estimate", "a100")
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("ESTIMATE for NVIDIA A100") and "not a measurement" in out
