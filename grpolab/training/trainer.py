"""The GRPO loop. One step reads like the data flow of docs/design.md section 2:

    collect (problems -> G completions each -> rewards -> advantages; grpolab.training.batch)
      -> [KL penalty folded into the reward]
      -> update (mu x minibatches x micro-batches; grpolab.training.update) -> sync the sampler's weights
      -> metrics -> [periodic held-out eval] -> log (JSONL, trackers) -> [checkpoint; the best by held-out]

Checkpoint contents and exact resume: grpolab.models.checkpoint and grpolab.training.checkpointing (`state_dict`,
`load`). Ctrl-C and SIGTERM: grpolab.training.faults; a sampler lost mid-run: grpolab.training.sampler_faults.
Experiment trackers (run.report_to) and completions tables: grpolab.training.trackers. Process-wide settings
(deterministic algorithms, mallopt) are held for the run and put back after it: grpolab.training.process_settings.
``progress(message)``: one line before each phase that can take over ~20 s. On-policy distillation (algorithm.estimator
= distill): grpolab.training.distill replaces the group advantages by the teacher's per-token ones before the update.
The periodic reference reset (algorithm.ref_reset_every): grpolab.training.reference, after the update. Most completions
cut in the first steps: grpolab.training.truncation.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..config import Config
from ..errors import GrpolabError
from ..evaluation.heldout import EvalResult, greedy_eval
from ..models import checkpoint as ckpt
from ..models.load import DTYPES, resolve_model_path
from ..rewards.health import RewardFailureStreak
from ..rollout.engines import EngineRequest, make_engine
from ..rollout.workers.process import EngineDied
from ..tasks.base import Problem
from . import precision
from .agent_batch import collector_class
from .batch import Batch, BatchCollector
from .builders import build_optimizer, build_reference, build_rewards, cpu_attention_note, load_policy, run_problems
from .checkpointing import LOGS, TrainerCheckpoints
from .distributed import World, all_reduce_sum, engine_ranks, gather_objects, init_world, resolve_device
from .estimators import AdvantageContext, EstimatorModels, estimator_spec
from .faults import InterruptGuard, NonFiniteTracker, TrainingInterrupted
from .group_rules import GroupRule
from .metrics import JsonlSink, NullSink, completion_table, peak_rss_mb, sample_records, sync_metrics
from .pipeline import make_pipeline
from .process_settings import ProcessSettings
from .prompt_sampler import PromptSampler
from .reference import (
    check_reset_config,
    clear_optimizer,
    clears_optimizer,
    reset_due,
    reset_reference,
)
from .reproducibility import training_attention
from .sampler_faults import SamplerFaults
from .schedule import align_schedule
from .sharding import Strategy, check_shardable, shard
from .trackers import Trackers, check_installed, run_texts
from .truncation import TruncationWatch
from .update import PolicyUpdater

log = logging.getLogger("grpolab")
Progress = Callable[[str], None]  # told one line before each phase that can take over ~20 s (Trainer.progress)


def r_k(cfg: Config) -> int:
    """rollout.max_staleness: how many steps ahead the engine samples (0: synchronous)."""
    return cfg.rollout.max_staleness


class Trainer(TrainerCheckpoints, SamplerFaults):
    """``rewards``: Python reward callables by name, beside the config's (grpolab.api); ``problems``: (train,
    held-out, data summary) given in memory instead of loaded from the config's task (grpolab.api).

    ``precision``: a resumed run's recorded resolution of train.precision / rollout.dtype (its manifest's
    ``precision``), reused instead of probing again. ``self.cfg`` is the config as given (train.precision and
    rollout.dtype may be "auto"; ``self.config_given`` is the same object); ``self.precision`` is the resolution
    (what the manifest records), read through ``update_precision`` and ``sampling_dtype``.

    ``progress(message)``: told (rank 0) before each phase that can take over ~20 s -- loading the models, the
    precision probe, a checkpoint's restore, the first step's sampling and update, each held-out eval and
    checkpoint write; None is silent; may be set as ``trainer.progress`` later.

    Process-wide settings (train.deterministic, speed.keep_freed_memory; grpolab.training.process_settings) are
    applied here and put back when ``fit`` ends, on ``close()`` or on leaving ``with Trainer(...) as trainer``."""

    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        world: World | None = None,
        rewards: dict[str, Callable[..., Any]] | None = None,
        problems: tuple[list[Problem], list[Problem], dict[str, Any]] | None = None,
        precision: dict[str, Any] | None = None,
        progress: Progress | None = None,
    ):
        self.cfg = self.config_given = cfg
        self.run_dir = Path(run_dir)
        self.progress = progress
        check_installed(cfg.run.report_to)  # a tracker asked for but not installed: one line, before any model loads
        self.device = resolve_device(cfg.train.device)
        keep_freed = self.device.type == "cpu" and cfg.speed.keep_freed_memory
        self.settings = ProcessSettings(cfg.train.deterministic, keep_freed)
        self.settings.apply()  # before the models load: every allocation from here on
        try:
            self.build(cfg, world, rewards, problems, precision)
        except BaseException:
            self.settings.restore()  # a trainer that failed to build leaves the process as it found it
            raise

    def build(
        self,
        cfg: Config,
        world: World | None,
        rewards: dict[str, Callable[..., Any]] | None,
        problems: tuple[list[Problem], list[Problem], dict[str, Any]] | None,
        precision: dict[str, Any] | None,
    ) -> None:
        """The rest of __init__ (after the process settings), one concern per builder, in this order."""
        self.world = world or init_world(self.device)
        check_reset_config(cfg)  # before anything loads
        spec = estimator_spec(cfg)  # algorithm.estimator's registered step (grpolab.training.estimators)
        spec.check(cfg)
        ckpt.seed_everything(cfg.train.seed)
        self.build_data(cfg, rewards, problems)  # before any model
        self.build_models(cfg, precision)
        self.build_engine(cfg)
        self.build_loop(cfg, spec.group(cfg.algorithm))
        self.start_loop_state()
        if cfg.algorithm.estimator == "distill":
            self.tell(f"loading the teacher {cfg.distill.teacher} (on-policy distillation)")
        fp32_inside = cfg.speed.attention_fp32 and self.update_precision == "bf16"
        models = EstimatorModels(
            cfg,
            self.policy,
            self.tokenizer,
            self.model_path,
            self.device,
            self.world,
            self.update_precision,
            fp32_inside,
        )
        self.estimator = spec.build(models)  # the advantage step; PPO's critic, distillation's teacher

    def build_data(self, cfg: Config, rewards: dict[str, Callable[..., Any]] | None, problems) -> None:
        """The rewards and the problems (grpolab.training.builders); a reward returning a non-number fails here."""
        self.rewards = build_rewards(cfg, rewards, self.device)
        self.data = run_problems(cfg, problems)
        self.train_problems, self.eval_problems, self.data_summary = (
            self.data.train,
            self.data.held_out,
            self.data.summary,
        )
        self.rewards.probe(self.train_problems[0])
        self.reward_failures, self.reward_results = RewardFailureStreak(fields=dict(self.rewards.fields)), []

    def build_models(self, cfg: Config, precision: dict[str, Any] | None) -> None:
        """The tokenizer, the policy, its precision (train.precision, rollout.dtype resolved) and the reference."""
        self.model_path = resolve_model_path(cfg.model.name)
        self.tell(f"loading the model {self.model_path}")
        self.tokenizer, self.policy = load_policy(cfg, self.model_path, self.device)
        self.precision = self.resolve_precision(precision)
        self.reference_dtype = torch.bfloat16 if self.update_precision == "bf16" else DTYPES[cfg.model.dtype]
        if cfg.algorithm.beta > 0:
            self.tell("making the reference model (algorithm.beta > 0)")
        self.reference = build_reference(cfg, self.policy, self.reference_dtype)  # LoRA: adapters off

    def build_engine(self, cfg: Config) -> None:
        """The sampler's engine (its copy of the weights made before sharding), then the CPU training attention and
        the sharding of the policy."""
        self.sharded = cfg.train.strategy == Strategy.FSDP2
        self.tell("preparing the sampler's copy of the model")
        agent = collector_class(self.train_problems) is not BatchCollector  # episodes for agent tasks
        every, ranks = self.train_problems + self.eval_problems, engine_ranks(self.world)  # ranks: vllm_server's syncs
        request = EngineRequest(
            cfg, self.policy, self.tokenizer, self.sampling_dtype, self.sharded, every, self.run_dir, ranks
        )
        self.engine = make_engine(request, agent)
        fp32_inside = cfg.speed.attention_fp32 and self.update_precision == "bf16"
        if note := cpu_attention_note(cfg, self.device, self.policy, fp32_inside):  # after the copies
            self.precision["attention"] = note
        if self.sharded:
            check_shardable(cfg, self.world, self.policy)
            shard(self.policy)

    def build_loop(self, cfg: Config, group: GroupRule) -> None:
        """The optimizer, the policy updater, the prompt order, the collector and (rollout.max_staleness > 0) the
        asynchronous pipeline over a QueuedEngine."""
        self.optimizer, self.scheduler = build_optimizer(cfg, self.policy, self.sharded)
        self.updater = PolicyUpdater(
            cfg, self.policy, self.reference, self.optimizer, self.scheduler, self.world, self.update_precision
        )
        t = cfg.train
        self.sampler = PromptSampler(self.train_problems, t.seed, t.prompt_schedule, t.prompt_floor)
        self.collector = collector_class(self.train_problems)(
            cfg, self.engine, self.tokenizer, self.sampler, self.rewards, group, self.world
        )
        self.pipeline = make_pipeline(cfg, self.collector, self.engine, self.world) if r_k(cfg) else None

    def start_loop_state(self) -> None:
        """The loop's counters and records before the first step (a resume loads them from the checkpoint)."""
        self.ref_resets, self.ref_reset_step = 0, 0  # algorithm.ref_reset_every: how many so far, the last one's step
        self.batch_version = 0  # the policy version (updates applied) that sampled the batch being trained
        self.step = 0
        self.saved_step: int | None = None  # step of the newest checkpoint this trainer wrote or loaded
        self.saved_at = time.monotonic()  # when it was written (for train.save_every_minutes)
        self.nonfinite = NonFiniteTracker(self.cfg.train.max_nonfinite_steps)
        self.skipped_in_step = 0
        self.last_eval: EvalResult | None = None
        self.best: dict[str, Any] | None = None  # the best checkpoint by held-out accuracy (checkpoints/best.json)
        self.table: tuple[list[str], list[list[Any]]] | None = None  # the last step's completions table, when due
        self.trackers = Trackers(self.run_dir, {}, {})  # opened by fit (rank 0)
        self.told_first_step = False  # the first step this trainer takes is announced phase by phase
        single_turn = type(self.collector) is BatchCollector  # agent episodes end by bounds of their own
        self.truncation = TruncationWatch(
            self.run_dir, self.cfg.rollout.max_new_tokens, self.world.main and single_turn
        )

    def tell(self, message: str) -> None:
        """``progress(message)`` on rank 0 (before a phase that can take over ~20 s)."""
        if self.progress is not None and getattr(self, "world", None) is not None and self.world.main:
            self.progress(message)

    def close(self) -> None:
        """Put back the process-wide settings this trainer applied (idempotent; ``fit`` does it when it ends) and stop
        the rollout engine's worker process, when it has one (rollout.engine: vllm)."""
        self.settings.restore()
        if "collector" in vars(self):  # built (a failed build may stop before it): what it started (an endpoint)
            self.collector.close()
        if "engine" in vars(self):
            self.engine.close()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def update_precision(self) -> str:
        """train.precision resolved: "fp32", "bf16" or "fp16" (autocast of the policy's forward passes)."""
        return self.precision["update"]

    @property
    def sampling_dtype(self) -> str:
        """rollout.dtype resolved: "float32", "bfloat16" or "float16" (the sampler's weight copy)."""
        return self.precision["sampling"]

    def resolve_precision(self, recorded: dict[str, Any] | None) -> dict[str, Any]:
        """train.precision / rollout.dtype resolved by grpolab.training.precision (explicit wins; auto: CUDA support or the
        CPU probe at this model's shapes; a resume's recorded resolution); rank 0 decides for every rank."""
        c = self.cfg
        shapes = precision.probe_shapes(
            *precision.model_dims(self.policy), c.train.micro_batch_size, c.rollout.max_new_tokens, c.rollout.group_size
        )

        def probe_told(probe_shapes: dict[str, list[int]]) -> dict[str, Any]:
            self.tell(
                "choosing fp32 or bf16 for this model (precision auto: measured once per machine and shape, "
                "then cached)"
            )
            return precision.probe(probe_shapes)

        mine = (
            precision.resolve(c.train.precision, c.rollout.dtype, self.device, shapes, recorded, run_probe=probe_told)
            if self.world.main
            else None
        )
        return gather_objects(mine, self.world)[0]

    # ------------------------------------------------------------------------------------------ one step

    def collect(self) -> Batch:
        if not self.told_first_step:
            c = self.cfg
            self.tell(
                f"step {self.step + 1}/{c.train.steps}: sampling {c.train.prompts_per_step} prompts x "
                f"{c.rollout.group_size} completions"
            )
        if self.pipeline is None:
            self.batch_version = self.step
            return self.collector.collect(self.step)
        self.pipeline.fill(self.step, self.step)  # the engine holds the weights after update `step`
        batch, self.batch_version = self.pipeline.take(self.step, self.step)
        return batch

    def train_step(self) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """One whole step (collect + update) without logging or checkpointing."""
        t0 = time.perf_counter()
        return self.update_step(self.collect(), t0)

    def advantage_context(self, batch: Batch) -> AdvantageContext:
        """What this step's advantage step reads (grpolab.training.estimators): never the trainer itself."""
        return AdvantageContext(
            batch,
            self.updater,
            self.policy,
            self.reference,
            self.update_precision,
            self.world,
            self.step,
            self.collector.global_advantages,
        )

    def update_step(self, batch: Batch, t0: float) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """Update the policy on a collected batch and return (metrics, samples) of the completed step."""
        t1 = time.perf_counter()
        rollout, scores, t = batch.rollout, batch.scores, self.cfg.train
        self.reward_results = scores.results  # gathered on every rank: every rank takes the same stop decision
        skipped = self.updater.skipped_steps
        if not self.told_first_step:
            self.tell(f"step {self.step + 1}/{t.steps}: updating the policy")
            self.told_first_step = True
        with training_attention(t.deterministic, self.device):  # PPO's critic update runs in the advantage step
            ref, old = self.estimator.prepare(self.advantage_context(batch))
            update_metrics = self.updater.update(
                rollout,
                batch.advantages,
                ~scores.invalid,
                ref_logp=ref,
                old_logp=old,
                positions=batch.positions,
                num_groups=batch.num_groups,
                step=self.step,
            )
        self.skipped_in_step = self.updater.skipped_steps - skipped
        self.step += 1
        align_schedule(self.scheduler, self.step * t.mu * t.minibatches)
        self.reset_reference_if_due()
        self.sync_sampler()  # a lost sampler: the step is finished without it, then the run stops
        t2 = time.perf_counter()
        if scores.invalid.any():
            first = next(e for e in scores.errors if e is not None)
            log.warning(
                "step %d: %d of %d completions have no valid reward (excluded from the update); first: %s",
                self.step,
                int(scores.invalid.sum()),
                len(rollout),
                first,
            )
        self.truncation.observe(self.step, batch.sampled_lengths, batch.sampled_truncated)  # steps 1-3: warns once
        timing = self.collector.timing
        tokens = all_reduce_sum(
            torch.tensor([float(rollout.completion_mask.sum() + rollout.prompt_mask.sum())]), self.world
        )
        metrics = {
            **batch.metrics,
            **update_metrics,
            "optim/lr": self.scheduler.get_last_lr()[0],
            "time/rollout_s": timing["rollout"],
            "time/reward_s": timing["reward"],
            "time/update_s": t2 - t1,
            "time/step_s": t2 - t0,
            "throughput/tokens_per_s": tokens.item() / (t2 - t0),
            "memory/peak_rss_mb": peak_rss_mb(),
            **self.reference_metrics(),
            **sync_metrics(self.engine.last_sync),
            **self.sampler_metrics(),
            **self.truncation.metrics(),
        }
        return metrics, self.samples(batch)

    def reset_reference_if_due(self) -> None:
        """After the update of every algorithm.ref_reset_every-th step: pi_ref <- pi_theta and, unless
        algorithm.ref_reset_optimizer is false, the optimizer's moments cleared (grpolab.training.reference)."""
        a = self.cfg.algorithm
        if self.reference is None or not reset_due(self.step, a.ref_reset_every):
            return
        self.reference = self.updater.reference = reset_reference(self.reference, self.policy, self.reference_dtype)
        if clears_optimizer(a):
            clear_optimizer(self.optimizer)
        self.ref_resets, self.ref_reset_step = self.ref_resets + 1, self.step

    def reference_metrics(self) -> dict[str, float]:
        """reference/resets and reference/last_reset_step (0: the base model), in a run with resets configured."""
        if not self.cfg.algorithm.ref_reset_every:
            return {}
        return {"reference/resets": float(self.ref_resets), "reference/last_reset_step": float(self.ref_reset_step)}

    def samples(self, batch: Batch) -> list[dict[str, Any]]:
        """train.samples_per_step rows of the trained batch, spread over its groups (and the trackers' completions
        table, when due)."""
        run = self.cfg.run
        due = bool(
            run.report_to and run.table_every_steps and self.step % run.table_every_steps == 0 and self.world.main
        )
        self.table = (
            completion_table(batch, self.tokenizer, run.table_groups, self.cfg.train.seed, self.step) if due else None
        )
        version = self.batch_version if self.pipeline is not None else None
        return sample_records(batch, self.step, self.cfg.train.samples_per_step, self.cfg.rollout.group_size, version)

    def evaluate(self) -> EvalResult:
        max_new = self.cfg.eval.max_new_tokens or self.cfg.rollout.max_new_tokens
        self.tell(f"step {self.step}/{self.cfg.train.steps}: held-out eval on {len(self.eval_problems)} problems")
        problems, size = self.eval_problems, self.cfg.eval.batch_size
        self.last_eval = greedy_eval(self.engine, self.tokenizer, problems, max_new, size, model=self.cfg.model.name)
        return self.last_eval

    def eval_metrics(self) -> dict[str, float]:
        r = self.evaluate()
        return {
            "eval/accuracy": r.accuracy,
            "eval/ci_low": r.ci_low,
            "eval/ci_high": r.ci_high,
            "eval/n": r.n,
            "eval/len_mean": r.len_mean,
            "eval/truncated_frac": r.truncated_frac,
        }

    # ------------------------------------------------------------------------------------------ loop

    def fit(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, float]:
        """Run to train.steps, logging every step, evaluating every eval.every_steps, checkpointing.

        Ctrl-C: see grpolab.training.faults (raises TrainingInterrupted after writing a checkpoint); a lost sampler:
        grpolab.training.sampler_faults (SamplerLost, likewise). Non-finite steps are skipped and stop the run after
        train.max_nonfinite_steps in a row (GrpolabError). The process-wide settings are (re)applied for the loop and
        put back when it returns or raises."""
        self.settings.apply()
        metrics: dict[str, float] = {}
        sinks = {name: JsonlSink(self.run_dir / name) if self.world.main else NullSink() for name in LOGS}
        if self.world.main and self.cfg.run.report_to:
            self.trackers = Trackers.open(self.cfg, self.run_dir, self.step, run_texts(self.run_dir))
        try:
            with InterruptGuard() as guard:
                while self.step < self.cfg.train.steps:
                    before, t0 = self.cursor_state(), time.perf_counter()
                    try:
                        batch = self.collect()
                    except KeyboardInterrupt:  # nothing trained yet: roll the step back and keep the last one
                        raise self.stop_before_update(before) from None
                    except EngineDied as e:  # the sampler lost (grpolab.training.sampler_faults): the same
                        raise self.stop_before_update(before, e) from None
                    with guard.critical_section():
                        metrics = self.end_step(*self.update_step(batch, t0), sinks, on_step)
                        self.stop_if_sampler_lost()
                    if guard.requested:
                        raise self.interrupted()
                with guard.critical_section():
                    if self.saved_step != self.step:
                        self.save()
        except KeyboardInterrupt:  # a second Ctrl-C inside the critical section
            raise TrainingInterrupted(self.run_dir, ckpt.latest_checkpoint(self.run_dir), written=False) from None
        finally:
            for sink in sinks.values():
                sink.close()
            self.trackers.close()
            self.settings.restore()
            self.data.close()  # what the task holds (the OpenEnv server an openenv task started); nothing for most
        return metrics

    def end_step(
        self,
        metrics: dict[str, float],
        samples: list[dict[str, Any]],
        sinks: dict[str, JsonlSink],
        on_step: Callable[[int, dict[str, float]], None] | None,
    ) -> dict[str, float]:
        """Periodic eval, logging, non-finite bookkeeping and the periodic checkpoint of the step just taken."""
        cfg, step = self.cfg, self.step
        evaluated = bool(cfg.eval.every_steps) and (step % cfg.eval.every_steps == 0 or step == cfg.train.steps)
        if evaluated and self.world.main:
            metrics.update(self.eval_unless_lost())
            if self.last_eval is not None:  # each problem's right/wrong: the report pairs the periodic evals by them
                right = {i["uid"]: int(bool(i["correct"])) for i in self.last_eval.items}
                sinks["eval_items.jsonl"].log(step, {"correct": right})
        bad = self.skipped_in_step > 0 or not all(math.isfinite(v) for k, v in metrics.items() if k.startswith("loss/"))
        sinks["metrics.jsonl"].log(step, metrics)
        for s in samples:
            sinks["samples.jsonl"].log(step, s)
        if self.table is not None:
            self.trackers.log_table(step, *self.table)
        self.trackers.log(step, metrics)
        if on_step:
            on_step(step, metrics)
        if self.nonfinite.record(step, bad, self.updater.skipped_steps):
            last = ckpt.latest_checkpoint(self.run_dir)
            raise GrpolabError(
                f"step {step}: {self.nonfinite.streak} consecutive steps with a non-finite loss or gradient "
                f"(train.max_nonfinite_steps = {self.nonfinite.limit}); stopped. "
                + (f"The last good checkpoint is {last}" if last else "No checkpoint was written")
            )
        if (stop := self.reward_failures.record(step, self.reward_results)) is not None:
            last = ckpt.latest_checkpoint(self.run_dir)
            raise GrpolabError(stop + (f" The last checkpoint is {last}." if last else " No checkpoint was written."))
        if evaluated:
            self.keep_if_best(metrics)
        if self.checkpoint_due() and step < cfg.train.steps and not self.nonfinite.streak and self.saved_step != step:
            self.save()
        return metrics
