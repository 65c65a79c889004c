"""A training worker for the data-parallel tests: `python worker.py SPEC.json` as one process, or under
`torchrun --nproc-per-node 2`. SPEC: {"runs": [{"name", "config"}], "out": dir}. For each run it trains with the
grpolab Trainer and writes, per rank, the token ids each global group sampled and how many groups the rank
trained per step (out/<name>/rank-<r>.json)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from grpolab.config import from_dict
from grpolab.training.distributed import init_world
from grpolab.training.trainer import Trainer


def run(name: str, raw: dict, out: Path, world) -> None:
    trainer = Trainer(from_dict(raw), out / name, world)
    sampled: dict[str, list[int]] = {}
    trained: list[int] = []
    generate_round, collect = trainer.collector.generate_round, trainer.collector.collect

    def record_round(step: int, index: int):
        rnd = generate_round(step, index)
        g = trainer.cfg.rollout.group_size
        for i, j in enumerate(rnd.owned):
            for k in range(g):
                row = i * g + k
                ids = rnd.rollout.completion_ids[row][rnd.rollout.completion_mask[row].bool()].tolist()
                sampled[f"{step}/{index}/{j}/{k}"] = ids
        return rnd

    def record_collect(step: int = 0):
        batch = collect(step)
        trained.append(len(batch.positions))
        return batch

    trainer.collector.generate_round, trainer.collector.collect = record_round, record_collect
    trainer.fit()
    (out / name / f"rank-{world.rank}.json").write_text(json.dumps({"sampled": sampled, "trained_groups": trained}))


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    world = init_world(torch.device("cpu"))
    out = Path(spec["out"])
    for r in spec["runs"]:
        (out / r["name"]).mkdir(parents=True, exist_ok=True)
        run(r["name"], r["config"], out, world)


if __name__ == "__main__":
    main()
