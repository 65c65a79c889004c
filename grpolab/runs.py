"""Creating a run directory and its manifest (DESIGN.md section 6)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from . import manifest as mf
from .card import objective_card
from .config import Config, to_dict
from .errors import GrpolabError
from .tasks.base import Problem


def new_run_dir(cfg: Config) -> Path:
    name = cfg.run.name or f"{cfg.task.name}-{cfg.algorithm.preset}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = Path(cfg.run.output_dir) / name
    if path.exists() and any(path.iterdir()):
        raise GrpolabError(f"run.name: {path} already exists and is not empty; choose another name or use --resume")
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_manifest(cfg: Config, model_path: str, tokenizer, train: list[Problem], held_out: list[Problem]) -> dict[str, Any]:
    hashes = mf.hash_model_dir(model_path)
    return {
        "grpolab_manifest": 1,
        "command": " ".join(["grpolab", *sys.argv[1:]]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": to_dict(cfg),
        "objective": objective_card(cfg),
        "hashes": {
            "model_weights": hashes["weights"],
            "tokenizer": hashes["tokenizer"],
            "chat_template": mf.sha256_bytes((tokenizer.chat_template or "").encode()),
            "reward_code": mf.reward_code_hash(),
            "train_data": mf.data_hash(train),
            "held_out_data": mf.data_hash(held_out),
        },
        "model_path": model_path,
        "train_problem_hashes": mf.problem_hashes(train),
        "versions": mf.versions(),
        "git": mf.git_state(),
        "seed": cfg.train.seed,
        "machine": mf.machine(),
    }
