"""A trainer's checkpoints: what one holds (state_dict), writing it (save), restoring it exactly (load, resume),
when one is due, and the best one by held-out accuracy (keep_if_best). Mixed into grpolab.training.trainer.Trainer;
the files and their layout: grpolab.models.checkpoint."""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from ..errors import GrpolabError
from ..models import checkpoint as ckpt
from ..models.load import load_causal_lm, load_weights
from .distributed import all_reduce_max, barrier, gather_objects
from .faults import TrainingInterrupted
from .metrics import truncate_log
from .reference import (
    reference_state,
    restore_reference,
)
from .sharding import full_model_state, full_optimizer_state, load_full_state

LOGS = ("metrics.jsonl", "samples.jsonl", "eval_items.jsonl")  # truncated to their checkpointed length on resume
log = logging.getLogger("grpolab")


class TrainerCheckpoints:
    """The checkpoint methods of Trainer (they read and write its policy, optimizer, scheduler, RNG and counters)."""

    def keep_if_best(self, metrics: dict[str, float]) -> None:
        """After a periodic held-out eval: when its accuracy beats every earlier one (ckpt.is_better: a tie keeps the
        earlier step), checkpoint this step and name it the best (checkpoints/best.json, kept out of keep_last's
        pruning). Training reward never decides; a step with a non-finite loss is never the best. Rank 0 decides."""
        value = metrics.get(ckpt.BEST_METRIC, math.nan) if self.world.main else math.nan
        better = ckpt.is_better(value, self.best["value"] if self.best else None) and not self.nonfinite.streak
        if not gather_objects(better, self.world)[0]:
            return
        self.best = (
            {
                "step": self.step,
                "checkpoint": f"checkpoints/step-{self.step}",
                "metric": ckpt.BEST_METRIC,
                "value": value,
                "ci_low": metrics.get("eval/ci_low"),
                "ci_high": metrics.get("eval/ci_high"),
                "num_problems": len(self.eval_problems),
                "training_reward": metrics.get("reward/mean"),
                "rule": "highest held-out accuracy of the periodic greedy eval (eval.every_steps); a tie keeps "
                "the earlier step; training reward is not used",
            }
            if self.world.main
            else None
        )
        self.save()  # its trainer state holds the new best, so a resume agrees with best.json
        if self.world.main:
            ckpt.write_best(self.run_dir, self.best)
            ckpt.prune(self.run_dir, self.cfg.train.keep_last)

    def checkpoint_due(self) -> bool:
        """train.save_every steps, or train.save_every_minutes since the last checkpoint (0 turns either off); the
        ranks' clocks differ, so any rank's "due" makes it due on all of them."""
        t = self.cfg.train
        by_step = bool(t.save_every) and self.step % t.save_every == 0
        by_time = bool(t.save_every_minutes) and time.monotonic() - self.saved_at >= 60 * t.save_every_minutes
        return bool(all_reduce_max(torch.tensor([float(by_step or by_time)]), self.world).item())

    def interrupted(self) -> TrainingInterrupted:
        """Checkpoint the last completed step (unless it already is, or nothing was trained) for a Ctrl-C."""
        written = self.step > 0 and self.saved_step != self.step and not self.nonfinite.streak
        if written:
            self.save()
        return TrainingInterrupted(self.run_dir, ckpt.latest_checkpoint(self.run_dir), written)

    # ------------------------------------------------------------------------------------------ state

    def cursor_state(self) -> dict[str, Any]:
        """What a step changes before its update: the RNG states and the prompt cursor (cheap to copy)."""
        return {"rng": ckpt.rng_state(), "sampler": self.sampler.state_dict()}

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs besides the weights (docs/robustness.md). Dynamic sampling keeps no
        state across steps (each step refills from the prompt cursor), so the cursor covers it."""
        return {
            **self.cursor_state(),
            "step": self.step,
            "optimizer": full_optimizer_state(self.policy, self.optimizer)
            if self.sharded
            else self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "faults": {"skipped_steps": self.updater.skipped_steps, **self.loss_scaler_state()},
            "logs": {name: _size(self.run_dir / name) for name in LOGS},
            "torch_threads": torch.get_num_threads(),
            "world_size": self.world.size,
            "rank_rng": gather_objects(ckpt.rng_state(), self.world),
            "best": self.best,
            **self.reference_checkpoint(),
            **({"pipeline": self.pipeline.state_dict()} if self.pipeline is not None else {}),
            **self.estimator.state_dict(),  # PPO's critic (grpolab.training.estimators)
        }

    def loss_scaler_state(self) -> dict[str, Any]:
        """The fp16 update's loss scale, its good-step count and overflow skips ({} in fp32 and bf16): a resume
        continues with the same scale (grpolab.training.loss_scale)."""
        scaler = self.updater.scaler
        return {"loss_scaler": scaler.state_dict()} if scaler is not None else {}

    def reference_checkpoint(self) -> dict[str, Any]:
        """The reference's part of the trainer state: with resets configured their count and last step, and once one
        happened the reference's weights (it is no longer the base model a resume rebuilds; grpolab.training.reference)."""
        if not self.cfg.algorithm.ref_reset_every:
            return {}
        weights = reference_state(self.reference) if self.ref_resets else None
        return {"reference": {"resets": self.ref_resets, "last_reset_step": self.ref_reset_step, "weights": weights}}

    def save(self) -> Path:
        """Write checkpoints/step-N atomically; a failed write (full disk...) stops the run with the previous
        checkpoint intact."""
        state = self.state_dict()  # a collective: every rank's RNG state goes into rank 0's checkpoint
        weights = full_model_state(self.policy) if self.sharded else None  # fsdp2: gathered (a collective)
        path = ckpt.checkpoint_path(self.run_dir, self.step)
        self.tell(f"step {self.step}/{self.cfg.train.steps}: writing checkpoint {path.name}")
        try:
            if self.world.main:
                path = ckpt.save_checkpoint(
                    self.run_dir,
                    self.step,
                    self.policy,
                    self.tokenizer,
                    state,
                    self.cfg.train.keep_last,
                    weights,
                    self.cfg.speed.checkpoint_direct_io,
                )
        except (OSError, RuntimeError) as e:
            prev = ckpt.latest_checkpoint(self.run_dir)
            kept = f"the previous checkpoint {prev} is intact" if prev else "there is no earlier checkpoint"
            raise GrpolabError(
                f"could not write the checkpoint of step {self.step} ({type(e).__name__}: {e}); {kept}; "
                f"fix the cause (disk space?) and continue with: grpolab train --resume {self.run_dir}"
            ) from None
        barrier(self.world)  # no rank runs ahead of a checkpoint that is not on disk yet
        self.saved_step, self.saved_at = self.step, time.monotonic()
        return path

    def load(self, path: Path) -> None:
        """Restore a checkpoint. The RNG states are restored last, after everything that could draw from them."""
        self.tell(f"restoring {path}")
        state = ckpt.load_state(path)
        saved_world = state.get("world_size", 1)
        if saved_world != self.world.size:
            raise GrpolabError(
                f"{path} was written by {saved_world} process(es), this run has {self.world.size}: resume "
                f"with the same number (torchrun --nproc-per-node {saved_world} ... or grpolab train "
                f"--nproc {saved_world} --resume {self.run_dir})"
            )
        if self.sharded:  # every rank reads the full state and keeps its shards
            load_full_state(
                self.policy,
                self.optimizer,
                load_causal_lm(str(path), self.cfg.model.dtype).state_dict(),
                state["optimizer"],
            )
        else:
            load_weights(self.policy, path, self.cfg.model.dtype)  # the full model, or the LoRA adapter
            self.optimizer.load_state_dict(state["optimizer"])
        if self.cfg.rollout.engine == "vllm_server":  # the servers' weight versions continue the run's (step + 1)
            self.engine.sync_weights(self.policy, version=state["step"] + 1)
        else:
            self.engine.sync_weights(self.policy)
        if self.pipeline is not None:  # rollout.max_staleness > 0: the steps generated ahead (training/pipeline.py)
            if "pipeline" not in state:
                raise GrpolabError(f"{path} holds no rollout queue: it was written with rollout.max_staleness = 0")
            self.pipeline.load_state_dict(state["pipeline"], self.train_problems, str(path))
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        faults = state.get("faults", {})
        self.updater.skipped_steps = faults.get("skipped_steps", 0)
        if self.updater.scaler is not None and "loss_scaler" in faults:  # fp16 (grpolab.training.loss_scale)
            self.updater.scaler.load_state_dict(faults["loss_scaler"])
        for name, offset in state.get("logs", {}).items() if self.world.main else ():
            truncate_log(self.run_dir / name, offset)
        self.step = self.saved_step = state["step"]
        self.best = state.get("best")
        self.load_reference(state.get("reference"), path)
        if self.best and self.world.main:  # a kill between the checkpoint and best.json: the checkpoint's record wins
            ckpt.write_best(self.run_dir, self.best)
            ckpt.prune(self.run_dir, self.cfg.train.keep_last)
        if state.get("torch_threads", torch.get_num_threads()) != torch.get_num_threads():
            log.warning(
                "%s was written with %d torch threads, this process uses %d: CPU results may differ in the "
                "last bits (set OMP_NUM_THREADS=%d for an exact resume)",
                path,
                state["torch_threads"],
                torch.get_num_threads(),
                state["torch_threads"],
            )
        self.estimator.load_state_dict(state)
        ckpt.set_rng_state(state["rank_rng"][self.world.rank] if "rank_rng" in state else state["rng"])

    def load_reference(self, saved: dict[str, Any] | None, path: Path) -> None:
        """Restore the reset reference of a checkpoint (reference_checkpoint); nothing before the first reset."""
        if saved is None or saved.get("weights") is None or self.reference is None:
            return
        try:
            restored = restore_reference(self.reference, self.policy, self.reference_dtype, saved["weights"])
        except ValueError as e:
            raise GrpolabError(f"{path}: {e}") from None
        self.reference = self.updater.reference = restored
        self.ref_resets, self.ref_reset_step = saved["resets"], saved["last_reset_step"]

    def resume(self) -> Path | None:
        """Continue from the newest complete checkpoint, or from step 0 (logs emptied) when there is none."""
        ckpt.remove_partial(self.run_dir)
        path = ckpt.latest_checkpoint(self.run_dir)
        if path is None:
            for name in LOGS if self.world.main else ():
                truncate_log(self.run_dir / name, 0)
            return None
        self.load(path)
        return path


def _size(path: Path) -> int:
    return os.path.getsize(path) if path.is_file() else 0
