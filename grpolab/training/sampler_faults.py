"""The sampler lost mid-run: the rollout engine's worker exited or hung, or (rollout.engine vllm_server) no server is
left in rotation or one in rotation failed a weight sync -- an ``EngineDied`` (grpolab.rollout.workers.process;
grpolab.rollout.servers.ServerFault is one). The run stops as Ctrl-C stops it (grpolab.training.faults), with a
checkpoint of the last completed step and one line naming the cause and the resume command (``SamplerLost``):

- lost during the rollout, nothing is trained yet: the step is rolled back (RNG states and prompt cursor as after the
  last step) and the last completed step is checkpointed -- what an uninterrupted run had at that point;
- lost after the update (its weight sync, the periodic held-out eval): the step is finished without the sampler (its
  record written without the sync's and the eval's figures) and checkpointed; the resume gives the sampler the
  checkpoint's weights (a server's weight versions continuing the run's) and goes on as the uninterrupted run would.

With rollout.max_staleness > 0 later steps' generations were in flight, which no checkpoint can hold: the newest
checkpoint stands, as for Ctrl-C. Mixed into grpolab.training.trainer.Trainer.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from ..models import checkpoint as ckpt
from ..rollout.workers.process import EngineDied
from .faults import TrainingInterrupted

log = logging.getLogger("grpolab")
LOG_TAIL = re.compile(r";? the last lines of its log \(.*\):$")
"""The end of a worker's first error line that introduces its log's tail (vLLM's noise, not the cause)."""


def cause_line(error: BaseException) -> str:
    """The cause of an engine's fault on one line: the first line of its message (what died, when, its exit code or
    bound), without the tail of the engine's log that follows it.

    >>> cause_line(EngineDied("vLLM worker (pid 7) exited with code -9 during 'generate'; the last lines of its log "
    ...                       "(/tmp/w.log):\\nWARNING noise\\nValueError: not the cause"))
    "vLLM worker (pid 7) exited with code -9 during 'generate'"
    """
    lines = str(error).strip().splitlines()
    return LOG_TAIL.sub("", lines[0]).strip() if lines else type(error).__name__


class SamplerLost(EngineDied):
    """The run stopped because its sampler was lost at step `step` (module docstring). ``checkpoint``: the newest
    complete one (None: none yet); ``written``: whether this stop wrote it; ``fault``: the engine's own error."""

    def __init__(self, step: int, fault: BaseException, run_dir: Path, checkpoint: Path | None, written: bool):
        self.fault, self.checkpoint, self.written = fault, checkpoint, written
        again = f"continue with: grpolab train --resume {run_dir}"
        if checkpoint is None:
            kept, again = "no checkpoint yet", again + " (starts again from step 0)"
        elif written:
            kept = f"checkpoint of the last completed step written to {checkpoint}"
        else:
            kept = f"the newest checkpoint is {checkpoint}"
        super().__init__(f"step {step}: the sampler was lost ({cause_line(fault)}); {kept}; {again}")


class SamplerFaults:
    """The trainer's handling of a lost sampler (module docstring); reads its engine, policy, pipeline, counters."""

    sampler_fault: EngineDied | None = None  # lost after the update: held until the step's record is written

    def stop_before_update(self, before: dict[str, Any], fault: EngineDied | None = None) -> Exception:
        """The exception that ends a step cut during its rollout by Ctrl-C (fault None) or a lost sampler: the step
        rolled back to `before` (Trainer.cursor_state) and the last completed step checkpointed."""
        if self.pipeline is not None:  # later steps were drawn too: the last checkpoint stands
            last = ckpt.latest_checkpoint(self.run_dir)
            if fault is None:
                return TrainingInterrupted(self.run_dir, last, written=False)
            return SamplerLost(self.step + 1, fault, self.run_dir, last, written=False)
        self.sampler.load_state_dict(before["sampler"])
        ckpt.set_rng_state(before["rng"])
        return self.interrupted() if fault is None else self.sampler_lost(fault, self.step + 1)

    def sampler_lost(self, fault: EngineDied, step: int) -> SamplerLost:
        """Checkpoint the last completed step (unless it already is, nothing was trained, a non-finite streak is on
        or later generations are in flight) and name the fault of `step`."""
        written = self.pipeline is None and self.step > 0 and self.saved_step != self.step and not self.nonfinite.streak
        if written:
            self.save()
        return SamplerLost(step, fault, self.run_dir, ckpt.latest_checkpoint(self.run_dir), written)

    def hold_fault(self, fault: EngineDied) -> None:
        """A fault after the update: held, so the step is finished without the sampler (with generations in flight,
        rollout.max_staleness > 0, the run stops at once)."""
        if self.pipeline is not None:
            raise self.sampler_lost(fault, self.step) from None
        log.warning("step %d: %s; the step is finished without the sampler, then the run stops", self.step,
                    cause_line(fault))  # fmt: skip
        self.sampler_fault = fault

    def sync_sampler(self) -> None:
        """The policy's new weights into the sampler; with rollout.max_staleness queued behind the generations in
        flight, which finish on the weights they started with. A lost sampler is held (hold_fault)."""
        try:
            if self.pipeline is None:
                self.engine.sync_weights(self.policy)
            else:
                self.engine.sync_weights(self.policy, wait=False)
        except EngineDied as e:
            self.engine.last_sync = {}  # no figures of a sync that failed
            self.hold_fault(e)

    def eval_unless_lost(self) -> dict[str, float]:
        """The periodic held-out eval's metrics (Trainer.eval_metrics); none once the sampler is lost."""
        if self.sampler_fault is None:
            try:
                return self.eval_metrics()
            except EngineDied as e:
                self.hold_fault(e)
        self.last_eval = None
        return {}

    def stop_if_sampler_lost(self) -> None:
        """At the end of a step that lost its sampler after the update: checkpoint it and stop (SamplerLost)."""
        if self.sampler_fault is not None:
            fault, self.sampler_fault = self.sampler_fault, None
            raise self.sampler_lost(fault, self.step)

    def sampler_metrics(self) -> dict[str, float]:
        """rollout.engine vllm_server: servers/out_of_rotation and servers/retried_requests (VLLMServerEngine)."""
        return self.engine.fault_metrics() if self.cfg.rollout.engine == "vllm_server" else {}
