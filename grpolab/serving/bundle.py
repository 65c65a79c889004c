"""The release bundle of a run (`grpolab release`): one directory another stack serves as it is.

    bundle/  model.safetensors, config.json         the evaluated checkpoint (a LoRA adapter merged)
             tokenizer files, chat_template.jinja    the tokenizer and chat template the run trained with
             generation_config.json                  end-of-turn ids and sampling defaults of the run
             heldout.json                            the held-out answers the release was measured on
             release.json                            source run, hashes, card, held-out result, precision

The checkpoint bundled is the one the run's held-out evaluation measured (its row in RUN/eval/*.json), so what is
served is what was measured. generation_config.json carries every id the run's decoder stopped on (the model's
generation_config eos ids and the tokenizer's eos: grpolab.rollout.grpolab_engine.eos_ids) and the run's sampling settings --
temperature, top_p, top_k (0 written as 0: transformers' default of 50 is *not* what the run sampled with) -- and
the evaluation's max_new_tokens. A run whose answers also end on a text rule (rollout.stop_rule: code_block) says so
in release.json: no generation_config field can carry it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import GrpolabError
from ..evaluation.heldout import load_eval_problems, stop_rule_for
from ..manifest import hash_files, hash_model_dir, read_manifest, sha256_bytes, write_json_atomic
from ..models.export import export_model
from ..models.load import DTYPES, load_tokenizer
from ..models.lora import ADAPTER_WEIGHTS, is_adapter_dir

RELEASE_FILE, HELDOUT_FILE = "release.json", "heldout.json"
PRIMARY_EVAL = "base_vs_trained.json"


def _inside(path: str | None, run_dir: Path) -> bool:
    if not path:
        return False
    try:
        Path(path).resolve().relative_to(run_dir.resolve())
        return True
    except ValueError:
        return False


def held_out_eval(run_dir: Path, task: str) -> tuple[Path, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(file, eval JSON, base row, trained row) of the run's held-out evaluation on its training task:
    eval/base_vs_trained.json, else the first other eval JSON with the base and a model inside the run."""
    files = sorted((run_dir / "eval").glob("*.json"), key=lambda p: (p.name != PRIMARY_EVAL, p.name))
    for f in files:
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (
            not isinstance(data, dict)
            or not data.get("grpolab_eval")
            or data.get("task") != task
            or data.get("capability")
            or data.get("diversity")
            or len(data.get("models") or []) < 2
        ):
            continue
        rows = data["models"]
        trained = next(
            (m for m in rows[1:] if _inside(m.get("path"), run_dir) or _inside(m.get("model"), run_dir)), None
        )
        if trained is not None:
            return f, data, rows[0], trained
    raise GrpolabError(
        f"{run_dir}/eval: no held-out evaluation of this run's model on its task {task!r}; a release "
        f"is made from a measured model: run `grpolab eval BASE {run_dir} --out "
        f"{run_dir}/eval/{PRIMARY_EVAL}` first"
    )


def heldout_record(file: Path, data: dict[str, Any], row: dict[str, Any], label: str) -> dict[str, Any]:
    """What a model's held-out result is: the evaluation set and decoding, its accuracy with the 95% interval, and
    each problem's greedy answer and score (the record a later rollback reproduces on a sample)."""
    return {
        "source": str(file),
        "sha256": hash_files([file]),
        "model": label,
        "task": data["task"],
        "task_options": data.get("task_options") or {},
        "split": data.get("split", "test"),
        "n": data.get("n"),
        "data_hash": data.get("data_hash"),
        "max_new_tokens": data.get("max_new_tokens"),
        "dtype": data.get("dtype", "float32"),
        "metric": data.get("metric"),
        "accuracy": row["accuracy"],
        "ci_low": row["ci_low"],
        "ci_high": row["ci_high"],
        "items": [
            {"uid": it["uid"], "accuracy": it["scores"]["accuracy"], "completion": it["completion"]}
            for it in row["items"]
        ],
    }


def generation_settings(
    config: dict[str, Any], stop_ids: list[int], pad_id: int | None, bos_id: int | None, max_new_tokens: int
) -> dict[str, Any]:
    """generation_config.json fields: the run's stop ids and sampling settings (module docstring).

    >>> generation_settings({"rollout": {"temperature": 0.8, "top_p": 1.0, "top_k": 0}}, [2], 2, 1, 48)["top_k"]
    0
    """
    rollout = config.get("rollout") or {}
    return {
        "bos_token_id": bos_id,
        "eos_token_id": list(stop_ids),
        "pad_token_id": pad_id,
        "do_sample": True,
        "temperature": float(rollout.get("temperature", 1.0)),
        "top_p": float(rollout.get("top_p", 1.0)),
        "top_k": int(rollout.get("top_k", 0)),
        "max_new_tokens": int(max_new_tokens),
    }


def _stop_ids(bundle: Path, tokenizer) -> list[int]:
    """The ids the run's decoder stopped on (grpolab.rollout.grpolab_engine.eos_ids) from the exported model's own
    generation_config (the checkpoint's, or a LoRA base's) and the tokenizer."""
    from transformers import GenerationConfig

    eos = GenerationConfig.from_pretrained(bundle).eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    return sorted(set(eos) | {tokenizer.eos_token_id})


def _checkpoint_hash(ckpt: Path) -> str | None:
    if is_adapter_dir(ckpt):
        return hash_files([ckpt / ADAPTER_WEIGHTS])
    return hash_model_dir(str(ckpt))["weights"]


def _resolved_stop_rule(config: dict[str, Any], record: dict[str, Any]) -> str:
    rule = (config.get("rollout") or {}).get("stop_rule", "none")
    if rule != "auto":
        return rule
    return stop_rule_for(load_eval_problems(record["task"], record["task_options"], record["split"], 1))


def write_release(run_dir: Path, out: Path, dtype: str | None = None) -> Path:
    """Write the release bundle of `run_dir` to `out` (atomically: a failure leaves nothing at `out`); dtype: the
    precision to write (default: the one the held-out evaluation ran in). Returns `out`."""
    run_dir, out = Path(run_dir), Path(out)
    manifest = read_manifest(run_dir)
    config = manifest.get("config") or {}
    file, data, base_row, trained_row = held_out_eval(run_dir, (config.get("task") or {}).get("name", ""))
    ckpt = Path(trained_row["path"])
    if not ckpt.is_dir():
        raise GrpolabError(f"{file}: the evaluated checkpoint {ckpt} no longer exists; re-evaluate the run")
    record = heldout_record(file, data, trained_row, str(run_dir))
    dtype = dtype or record["dtype"]
    if dtype not in DTYPES:
        raise GrpolabError(f"--dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GrpolabError(f"--out: {out} already exists and is not empty; choose another directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    parent = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        tmp = parent / "bundle"
        export_model(str(ckpt), tmp, merge=True, dtype=dtype)
        tokenizer = load_tokenizer(str(tmp))
        template = sha256_bytes((tokenizer.chat_template or "").encode())
        run_template = (manifest.get("hashes") or {}).get("chat_template")
        if run_template and template != run_template:
            raise GrpolabError(
                f"{ckpt}: its chat template (sha256 {template[:12]}) is not the one the run trained with "
                f"(manifest.json hashes.chat_template {run_template[:12]}); refusing to bundle it"
            )
        stop_ids = _stop_ids(tmp, tokenizer)
        settings = generation_settings(
            config,
            stop_ids,
            tokenizer.pad_token_id,
            tokenizer.bos_token_id,
            record["max_new_tokens"] or (config.get("rollout") or {}).get("max_new_tokens", 256),
        )
        (tmp / "generation_config.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
        write_json_atomic(tmp / HELDOUT_FILE, record)
        hashes = hash_model_dir(str(tmp))
        release = {
            "grpolab_release": 1,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "source_run": str(run_dir.resolve()),
            "checkpoint": str(ckpt.resolve()),
            "lora_merged": is_adapter_dir(ckpt),
            "hashes": {
                "checkpoint_weights": _checkpoint_hash(ckpt),
                "weights": hashes["weights"],
                "tokenizer": hashes["tokenizer"],
                "chat_template": template,
                "generation_config": hash_files([tmp / "generation_config.json"]),
                "run_manifest": hash_files([run_dir / "manifest.json"]),
            },
            "precision": {"written": dtype, "evaluated": record["dtype"], "trained": manifest.get("precision")},
            "generation": settings,
            "stop_rule": _resolved_stop_rule(config, record),
            "base_model": {
                "name": (config.get("model") or {}).get("name"),
                "path": manifest.get("model_path"),
                "weights": (manifest.get("hashes") or {}).get("model_weights"),
            },
            "held_out": {k: v for k, v in record.items() if k != "items"}
            | {"base_accuracy": base_row["accuracy"], "diff_vs_base": trained_row.get("diff_vs_first")},
            "objective": manifest.get("objective"),
        }
        write_json_atomic(tmp / RELEASE_FILE, release)
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    return out


def read_release(bundle: Path) -> dict[str, Any]:
    """release.json of a bundle (GrpolabError naming the file when it is missing or not a release manifest)."""
    path = Path(bundle) / RELEASE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise GrpolabError(
            f"{path}: cannot read a release manifest ({type(e).__name__}); expected a directory "
            f"written by `grpolab release`"
        ) from None
    if not isinstance(data, dict) or not data.get("grpolab_release"):
        raise GrpolabError(f"{path}: not a release manifest (no grpolab_release field)")
    return data
