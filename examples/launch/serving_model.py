"""The model directory a `vllm serve` you start loads for `rollout.engine: vllm_server` (docs/vllm.md): the model
with its word embeddings untied, as grpolab writes it for the servers it starts itself.

    python examples/launch/serving_model.py MODEL OUT_DIR        # MODEL: a hub id, a directory, bundled:..., a run

Why: vLLM 0.32 reloads weights in place and leaves a tied lm_head with its old values, so a server of a tied model
(SmolLM2, Qwen2.5-0.5B, Qwen3-0.6B) would sample with a stale output layer after every weight sync. Untied, every sync
loads both matrices; the logits are the same numbers. The copy holds the config (tie_word_embeddings: false), the
generation config, the tokenizer (the servers' /tokenize answers grpolab's check) and model.safetensors with
lm_head.weight beside the embeddings (bfloat16 unless --dtype says otherwise). Put it where every inference host
reads it (a shared filesystem, a volume).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from safetensors.torch import save_file

from grpolab.models.load import DTYPES, load_causal_lm, load_tokenizer, resolve_model_path
from grpolab.rollout.worker_engine import engine_config, policy_tensors


def write_serving_model(model: str, out: Path, dtype: str = "bfloat16") -> Path:
    """Write the untied serving copy of `model` into `out` (created; a directory that is not empty is refused)."""
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out}: exists and is not empty; give a new directory")
    path = resolve_model_path(model)
    policy = load_causal_lm(path, dtype)
    out.mkdir(parents=True, exist_ok=True)
    engine_config(policy).save_pretrained(out)
    policy.generation_config.save_pretrained(out)
    load_tokenizer(path).save_pretrained(out)
    save_file(policy_tensors(policy, DTYPES[dtype]), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="hub id, model directory, bundled:<alias> or a run directory")
    parser.add_argument("out", type=Path, help="the directory to write (new or empty)")
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="bfloat16",
        help="the weights' dtype on disk (the first weight sync replaces them in the server's own --dtype)",
    )
    args = parser.parse_args()
    print(write_serving_model(args.model, args.out, args.dtype))


if __name__ == "__main__":
    main()
