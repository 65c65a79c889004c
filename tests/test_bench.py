"""`grpolab bench CONFIG` (grpolab/training/bench.py, grpolab/cli/bench.py) on the tiny random model: the JSON's
fields and units, tokens/s > 0, MFU = achieved FLOP/s / peak in (0, 1], the FLOP counts against a hand count, the
passes each config option adds, the GPU peak table's order, and the printed definitions and anchors."""

from __future__ import annotations

import json

import pytest
import torch

from grpolab.config import from_dict
from grpolab.rollout.base import Rollout
from grpolab.training import bench
from grpolab.training.flops import ModelShape

pytestmark = pytest.mark.usefixtures("one_thread")

LP_FAKE, LC = 5, 4  # a hand-counted sequence: prompt 5 + completion 4


def tiny(model_dir: str, tmp_path, **train) -> dict:
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 16, "num_test": 4}},
        "rollout": {"group_size": 2, "max_new_tokens": LC, "dtype": "float32"},
        "algorithm": {"beta": 0.0},
        "train": {"steps": 2, "prompts_per_step": 2, "micro_batch_size": 2, "precision": "fp32", "device": "cpu"}
        | train,
        "run": {"output_dir": str(tmp_path / "runs"), "name": "b"},
    }


def hand_forward(vocab: int, lp: int, lc: int) -> float:
    """F_fwd of the conftest model (hidden 32, MLP 64, 2 layers, 4 heads x 8, 2 KV heads) counted by hand: per layer
    q 32*32 + k, v 32*16 each + o 32*32 + MLP 3*32*64 + two norms 2*32 = 9280; 2 layers + final norm = 18592."""
    n_body, n_head, layers, d_attn = 2 * 9280 + 32, vocab * 32, 2, 32
    inputs = lp + lc - 1
    keys = sum(p + 1 for p in range(inputs))
    return 2 * n_body * inputs + 2 * n_head * lc + 4 * layers * d_attn * keys


def test_bench_json_fields_units_and_flops(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from tests.test_bad_input import config_file
    from tests.test_cli_usage import cli_main

    out = tmp_path / "bench.json"
    cfg = config_file(tmp_path, tiny(tiny_model_dir, tmp_path))
    code, output = cli_main(monkeypatch, capsys, "bench", cfg, "--out", out, "--steps", "2")
    assert code == 0, output
    r = json.loads(out.read_text())
    assert r["device"]["type"] == "cpu" and r["device"]["name"] and r["precision"]["update"] == "fp32"
    assert list(r["peak"]) == ["fp32"] and "matmul probe" in r["peak"]["fp32"]["source"]
    peak = r["peak"]["fp32"]["flop_per_s"]
    solo, e2e = r["trainer_only"], r["end_to_end"]
    for part in (solo, e2e):
        assert part["tokens_per_s"] > 0 and part["peak_memory_mib"] > 0 and part["definition"]
        assert 0 < part["mfu"] <= 1
        assert part["mfu"] == pytest.approx(part["achieved_flop_per_s"] / peak)
    # trainer-only: 2 prompts x 2 = 4 sequences of (longest prompt + 4) tokens, forward + backward = 3 F_fwd each
    vocab = r["shape"]["n_head"] // 32
    lp = solo["prompt_tokens"]
    assert solo["sequences"] == 4 and solo["sequence_length"] == lp + LC and solo["tokens"] == 4 * (lp + LC)
    assert solo["flops"] == 4 * 3 * hand_forward(vocab, lp, LC)
    assert solo["tokens_per_s"] == pytest.approx(solo["tokens"] / solo["seconds"])
    assert solo["achieved_flop_per_s"] == pytest.approx(solo["flops"] / solo["seconds"])
    # end-to-end: both steps recorded, the second reported (the first is warm-up)
    assert len(e2e["steps"]) == 2 and e2e["step_s"] == e2e["steps"][1]["seconds"]
    assert e2e["tokens_per_s"] == pytest.approx(e2e["steps"][1]["tokens"] / e2e["steps"][1]["seconds"])
    assert {a["kind"] for a in r["anchors"]} == {"trainer-only", "end-to-end"}
    fit = r["memory_fit"]  # a tiny model on a machine with gigabytes: micro-batch 2 fits, with room to spare
    assert fit["fits"] and fit["largest_micro_batch"] >= 2 and fit["capacity_mib"] > fit["predicted_peak_mib"] > 0
    assert fit["predicted_peak_mib"] == pytest.approx(fit["base_mib"] + 2 * fit["per_sequence_mib"])
    text = output.replace("\n", " ")
    assert "trainer-only  forward + backward + optimizer step" in output and "end-to-end    real GRPO steps" in output
    assert "prime-rl benchmark table (trainer-only): Qwen3-0.6B full fine-tune, 16k-token sequences, 1x H100" in text
    assert "NeMo-RL (end-to-end): Llama-3.1-8B GRPO" in text and "1,581 tokens/s per GPU" in text
    assert "compare each only with its own kind" in text


def rollout_of(prompt_lens: list[int], completion_lens: list[int]):
    n, lp, lc = len(prompt_lens), max(prompt_lens), max(completion_lens)
    prompt = torch.tensor([[0] * (lp - p) + [1] * p for p in prompt_lens])  # left-padded
    completion = torch.tensor([[1] * c + [0] * (lc - c) for c in completion_lens])  # right-padded
    return Rollout(
        prompt_ids=prompt,
        prompt_mask=prompt,
        completion_ids=completion,
        completion_mask=completion,
        sampler_logprobs=torch.zeros(n, lc),
        truncated=torch.zeros(n, dtype=torch.bool),
        group=torch.arange(n) // 2,
        texts=[""] * n,
    )


@pytest.mark.parametrize(
    "overrides, has_reference, per_sequence",
    [
        ({}, False, 1 + 3),  # generation + forward/backward
        ({"train": {"mu": 2}}, True, 1 + 1 + 1 + 2 * 3),  # + reference, + pi_old's pass, two update passes
        ({"train": {"minibatches": 2}}, False, 1 + 1 + 3),  # pi_old's pass
        ({"model": {"lora": {"rank": 4}}}, False, 1 + 2),  # LoRA: no weight gradients
    ],
)
def test_a_real_steps_flops_count_each_pass(overrides, has_reference, per_sequence):
    raw = {"model": {"name": "x"}, "train": {"prompts_per_step": 1}, "rollout": {"group_size": 2}}
    for section, fields in overrides.items():
        raw[section] = {**raw.get(section, {}), **fields}
    cfg = from_dict(raw)
    shape = ModelShape(n_layers=2, d_model=32, d_attn=32, vocab=100, n_body=18592, n_head=3200)
    rollout = rollout_of([3, 3], [2, 1])
    seq = [hand_forward(100, 3, 2), hand_forward(100, 3, 1)]
    assert bench.batch_flops(shape, rollout, 2, cfg, has_reference) == per_sequence * sum(seq)


@pytest.mark.parametrize(
    "name, dtype, peak",
    [
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989.4e12),
        ("NVIDIA H100 PCIe", torch.bfloat16, 756.5e12),  # not the SXM figure: the PCIe entry comes first
        ("NVIDIA H200", torch.bfloat16, 989.4e12),
        ("NVIDIA A100-SXM4-80GB", torch.float32, 19.5e12),
    ],
)
def test_a_gpu_in_the_table_reads_its_spec_sheet(monkeypatch, name, dtype, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    p = bench.peak_flops(torch.device("cuda"), dtype, 32, 64, 128)
    assert p["flop_per_s"] == peak and "spec sheet" in p["source"]


def test_every_precision_the_config_takes_has_a_dtype_and_a_gpu_peak():
    """train.precision and rollout.dtype values (fp16 included) map to a torch dtype and back to a peak's key, and
    every GPU of the spec table has a peak for each (the bench of an fp16 config looked its peak up by name)."""
    import typing

    from grpolab.config.schema import RolloutConfig, TrainConfig

    hints = typing.get_type_hints
    names = [v for v in typing.get_args(hints(TrainConfig)["precision"]) if v != "auto"]
    names += [v for v in typing.get_args(hints(RolloutConfig)["dtype"]) if v != "auto"]
    for name in names:
        key = bench.NAME[bench.DTYPE[name]]
        assert all(key in peaks for _, _, peaks in bench.GPU_PEAKS), name
    assert bench.NAME[bench.DTYPE["float16"]] == "fp16"
