#!/usr/bin/env python
"""Writing a checkpoint with speed.checkpoint_direct_io on and off (grpolab/models/direct_io.py), in one process.

    python benchmarks/checkpoint_write.py --rounds 4

Builds the quickstart trainer (configs/quickstart.yaml, bf16 update and sampler, so the numbers do not depend on
the precision probe), trains --steps real steps so the optimizer holds its moments, then writes the run's
checkpoint again and again as `Trainer.save` does (`grpolab.models.checkpoint.save_checkpoint`: temporary
directory, every file fsync'ed, renamed into place), alternating the two settings --rounds times. Every checkpoint
is kept until the end, as in a run (each new one needs new page-cache pages when written the usual way). Checks
that both settings wrote the same tensors and the same trainer state, prints the median seconds of each and their
ratio, and deletes everything it wrote.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import cpu_features  # noqa: E402


def same_checkpoint(a: Path, b: Path) -> bool:
    """The same model tensors and the same optimizer moments in two checkpoints."""
    from safetensors.torch import load_file

    from grpolab.models.checkpoint import load_state

    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    if set(wa) != set(wb) or not all(torch.equal(wa[k], wb[k]) for k in wa):
        return False
    sa, sb = load_state(a)["optimizer"]["state"], load_state(b)["optimizer"]["state"]
    return set(sa) == set(sb) and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1)
    args = ap.parse_args()
    from grpolab.config import load_config
    from grpolab.models.checkpoint import save_checkpoint
    from grpolab.training.trainer import Trainer

    cfg = load_config(
        ROOT / "configs" / "quickstart.yaml",
        [
            "train.precision=bf16",
            "rollout.dtype=bfloat16",
            "eval.every_steps=0",
            "train.save_every=0",
            "train.save_every_minutes=0",
        ],
    )
    run_dir = Path(tempfile.mkdtemp(prefix="grpolab-ckpt-", dir=ROOT / "runs" if (ROOT / "runs").is_dir() else None))
    try:
        trainer = Trainer(cfg, run_dir)
        for _ in range(args.steps):
            trainer.train_step()
        state = trainer.state_dict()
        seconds: dict[bool, list[float]] = {True: [], False: []}
        written: dict[bool, Path] = {}
        for i in range(args.rounds):
            for direct in (True, False) if i % 2 == 0 else (False, True):
                t0 = time.perf_counter()
                written[direct] = save_checkpoint(
                    run_dir,
                    1000 + len(seconds[True]) + len(seconds[False]),
                    trainer.policy,
                    trainer.tokenizer,
                    state,
                    keep_last=10**6,
                    direct_io=direct,
                )
                seconds[direct].append(time.perf_counter() - t0)
        size = sum(p.stat().st_size for p in written[True].iterdir()) / 1e9
        same = same_checkpoint(written[True], written[False])
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    print(f"machine: {cpu_features()}  torch {torch.__version__}")
    print(f"checkpoint of the quickstart after {args.steps} step(s): {size:.2f} GB; {args.rounds} round(s), alternated")
    for direct in (False, True):
        print(
            f"checkpoint_direct_io {str(direct).lower():5s}: median {statistics.median(seconds[direct]):.2f} s  "
            f"(each: {', '.join(f'{s:.2f}' for s in seconds[direct])})"
        )
    ratio = statistics.median(seconds[True]) / statistics.median(seconds[False])
    print(f"direct / page cache: {ratio:.2f}x; same tensors and trainer state: {same}")
    if not same:
        raise SystemExit("the two settings wrote different checkpoints")


if __name__ == "__main__":
    main()
