"""A PPO worker for tests/test_ppo_distributed.py: `python ppo_worker.py SPEC.json` as one process, or under
`torchrun --nproc-per-node 2`. SPEC: {"config": a run config, "out": the run directory}. It trains with the
Trainer (algorithm.estimator gae: grpolab.baselines.ppo's step); rank 0 writes the run directory, metrics.jsonl included."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import grpolab.baselines.ppo  # noqa: F401 -- registers algorithm.estimator gae
from grpolab.config import from_dict
from grpolab.training.distributed import init_world
from grpolab.training.trainer import Trainer


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    world = init_world(torch.device("cpu"))
    cfg, out = from_dict(spec["config"]), Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    Trainer(cfg, out, world).fit()


if __name__ == "__main__":
    main()
