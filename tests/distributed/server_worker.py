"""A training worker for the two-node vllm_server test (tests/test_vllm_server_nodes.py): `python server_worker.py
SPEC.json` as one process, or under torchrun. SPEC: {"runs": [{"name", "config"}], "out": dir}. Each run is a
`grpolab train` as the command starts it (grpolab.runs.start_run, the reward `spread` given in memory); per rank it
writes out/<name>/rank-<r>.json (the token ids and weight versions each global group sampled at each step, and how
many weight-transfer groups the rank's engine held) and out/<name>/rank-<r>.safetensors (the rank's final weights).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from grpolab.config import from_dict
from grpolab.runs import start_run


def spread(completion: str, problem) -> float:
    """tests/test_vllm_server.py's reward: varies on the tiny model's near-random completions."""
    return len(set(completion)) / (len(completion) + 1)


def full_weights(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's weights as one tensor each (an FSDP2 shard gathered: a collective on every rank)."""
    out = {}
    for name, t in policy.state_dict().items():
        full = t.full_tensor() if hasattr(t, "full_tensor") else t
        out[name] = full.detach().cpu().clone()
    return out


def run(name: str, raw: dict, out: Path) -> None:
    trainer, _ = start_run(from_dict(raw), rewards={"spread": spread})
    sampled: dict[str, dict] = {}
    generate_round = trainer.collector.generate_round

    def record_round(step: int, index: int):
        rnd = generate_round(step, index)
        g, r = trainer.cfg.rollout.group_size, rnd.rollout
        for i, j in enumerate(rnd.owned):
            rows = range(i * g, (i + 1) * g)
            sampled[f"{step}/{index}/{j}"] = {
                "ids": [r.completion_ids[k][r.completion_mask[k].bool()].tolist() for k in rows],
                "versions": [r.weight_versions[k] for k in rows],
            }
        return rnd

    trainer.collector.generate_round = record_round
    try:
        trainer.fit()
        weights = full_weights(trainer.policy)
        senders = len(trainer.engine.senders)
    finally:
        trainer.close()
    rank = trainer.world.rank
    save_file(weights, str(out / name / f"rank-{rank}.safetensors"))
    record = {"sampled": sampled, "senders": senders, "run_dir": str(trainer.run_dir)}
    (out / name / f"rank-{rank}.json").write_text(json.dumps(record))


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    out = Path(spec["out"])
    for r in spec["runs"]:
        (out / r["name"]).mkdir(parents=True, exist_ok=True)
        run(r["name"], r["config"], out)


if __name__ == "__main__":
    main()
