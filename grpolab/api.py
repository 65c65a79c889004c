"""The Python API: the runs, evaluations, comparisons and reports of the `grpolab` command as function calls that
return result objects (docs/api.md). Long calls (``train``, ``evaluate_models``, ``release_report``) print progress
lines to stderr -- each slow phase before it starts, one line per training step or evaluated batch -- unless
``verbose=False``; stdout is left to the caller. Warnings about the run itself (most completions truncated, an
option inert in this configuration) go to the "grpolab" logger whatever ``verbose`` says: logging's configuration
decides where they show (stderr by default).

    import grpolab

    cfg = grpolab.load_config("configs/quickstart.yaml", **{"train.steps": 2, "reward.weights": {"correct": 1.0, "brevity": 0.1}})
    result = grpolab.train(cfg, rewards={"brevity": brevity}, run_dir="runs/api-demo")
    grpolab.release_report(result.run_dir, skip_safety=True).verdict

Each entry point runs the command's own code: ``train`` builds the run with grpolab.runs.start_run (resume_run with
``resume=``) and trains with Trainer.fit, as `grpolab train` does; ``evaluate_models`` is grpolab.evaluation.heldout.run_eval (`grpolab
eval`); ``compare`` is the comparison of `grpolab compare`; ``release_report`` is grpolab.report.build_report (`grpolab
report`). The same config and seed therefore give the same metrics.jsonl either way.

What only Python can pass:
- ``rewards={name: fn}``: reward callables, ``fn(completion, problem) -> float | None`` or batched
  (``@grpolab.batched``, grpolab.rewards.user); each needs a weight in ``reward.weights``. The manifest records
  each one's source hash (``hashes.reward_functions``) and its name (``python_rewards``).
- ``problems=``: a list of grpolab.Problem, or a ``datasets.Dataset`` / ``DatasetDict`` read with the rules of task
  ``hf`` (grpolab.tasks.hf; ``fields`` holds its options: prompt_field, answer_field, messages_field, ...). The held-out
  problems of a periodic eval are ``eval_problems`` (a list or a Dataset), else the Dataset's test split or its
  seeded held-out fraction; held-out problems that share a question with a training problem are refused. The run
  records task name "python" (the problems live in the caller's memory); the manifest hashes them
  (``hashes.train_data`` / ``held_out_data``) and, for a Dataset, records its fingerprint.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from .evaluation.result import write_result

if TYPE_CHECKING:
    from .config import Config


# ------------------------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class TrainResult:
    """A finished (or resumed and finished) run: its directory, the metrics of its last step (those of
    metrics.jsonl's last line, empty when there was nothing left to train), its newest checkpoint and its manifest."""

    run_dir: Path
    metrics: dict[str, float]
    checkpoint: Path | None
    manifest: dict[str, Any]
    steps: int

    def history(self) -> list[dict[str, Any]]:
        """Every line of the run's metrics.jsonl."""
        from .training.metrics import read_jsonl

        return read_jsonl(self.run_dir / "metrics.jsonl")


@dataclass(frozen=True)
class EvalReport:
    """An evaluation (the JSON `grpolab eval --out` writes, as ``data``) and where it was written, if anywhere."""

    data: dict[str, Any]
    path: Path | None = None

    @property
    def accuracy(self) -> dict[str, float]:
        """{model: greedy (or sampled) accuracy} in the order evaluated."""
        return {row["model"]: row["metrics"]["accuracy"]["mean"] for row in self.data["models"]}


@dataclass(frozen=True)
class Comparison:
    """A comparison (the JSON `grpolab compare --out` writes: ``eval_sets``, ``seed_groups``)."""

    data: dict[str, Any]
    path: Path | None = None


@dataclass(frozen=True)
class Report:
    """A release report: the verdict and why, every check, the written report.html / report.md, and all its data."""

    verdict: str
    reason: str
    checks: list[Any]
    paths: dict[str, Path]
    data: dict[str, Any] = field(repr=False)


# ------------------------------------------------------------------------------------------------ config


def load_config(
    source: Any = None, overrides: Mapping[str, Any] | Sequence[str] | None = None, **fields: Any
) -> "Config":
    """A validated Config from a YAML path, a dict (nested, or with dotted keys), a Config, or None (the defaults),
    with overrides applied in order: ``overrides`` (a mapping of dotted keys to values, or `--set` strings
    "a.b=value" read exactly as the command reads them), then keyword fields (``train__steps=2`` is "train.steps";
    dotted keys also work as ``**{"train.steps": 2}``). A value replaces the field whole (a mapping too). A
    resolved Config's algorithm fields are already expanded, so change ``algorithm.preset`` on its YAML or dict.

    >>> load_config({"train.steps": 3}, {"rollout.group_size": 4}, train__lr=1e-5).train.steps
    3
    """
    from .config import Config, from_dict, parse_override, set_path, to_dict
    from .config import load_config as load_yaml

    if isinstance(source, Config):
        raw = to_dict(source)
    elif isinstance(source, Mapping):
        raw = {}
        for key, value in copy.deepcopy(dict(source)).items():
            set_path(raw, str(key), value)
    elif source is None:
        raw = {}
    else:
        load_yaml(source)  # the command's own checks and messages for the file
        import yaml

        raw = yaml.safe_load(Path(source).read_text(encoding="utf-8")) or {}
    if isinstance(overrides, (str, bytes)):
        overrides = [overrides]
    if isinstance(overrides, Mapping):
        for key, value in overrides.items():
            set_path(raw, str(key), value)
    else:
        for text in overrides or ():
            set_path(raw, *parse_override(text))
    for key, value in fields.items():
        set_path(raw, key.replace("__", "."), value)
    return from_dict(raw)


def _say(verbose: bool) -> Callable[[str], None] | None:
    """The progress printer of a call: one flushed line to stderr when `verbose`, else None (silent)."""
    return (lambda message: print(message, file=sys.stderr, flush=True)) if verbose else None


def quiet_unless_verbose(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run `fn` with the libraries' own progress bars (transformers' "Loading weights", the hub's downloads) off when
    it is called with ``verbose=False``, and put them back as they were afterwards."""
    default = inspect.signature(fn).parameters["verbose"].default

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("verbose", default):
            return fn(*args, **kwargs)
        from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
        from transformers.utils import logging as hf_logging

        hub_was_on, hf_was_on = not are_progress_bars_disabled(), hf_logging.is_progress_bar_enabled()
        disable_progress_bars()
        hf_logging.disable_progress_bar()
        try:
            return fn(*args, **kwargs)
        finally:
            if hub_was_on:
                enable_progress_bars()
            if hf_was_on:
                hf_logging.enable_progress_bar()

    return call


def _with_run_dir(cfg: "Config", run_dir: str | Path | None) -> "Config":
    """cfg with run.output_dir / run.name pointing at `run_dir` (unchanged when None)."""
    if run_dir is None:
        return cfg
    run_dir = Path(run_dir)
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, output_dir=str(run_dir.parent), name=run_dir.name))


# ------------------------------------------------------------------------------------------------ in-memory problems


# ------------------------------------------------------------------------------------------------ entry points


@quiet_unless_verbose
def train(
    config: Any = None,
    *,
    rewards: Mapping[str, Callable[..., Any]] | None = None,
    problems: Any = None,
    eval_problems: Any = None,
    fields: Mapping[str, Any] | None = None,
    run_dir: str | Path | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    resume: str | Path | None = None,
    allow_changes: bool = False,
    from_intact: bool = False,
    verbose: bool = True,
) -> TrainResult:
    """Train with GRPO as `grpolab train` does and return the run (module docstring for ``rewards`` and ``problems``).

    ``config``: a Config, a YAML path or a dict (load_config). ``run_dir``: the new run's directory (else
    run.output_dir / run.name). ``on_step(step, metrics)`` is called after every step. ``resume=RUN_DIR`` continues a
    run from its newest checkpoint instead, as `grpolab train --resume` (its config comes from its manifest, and
    ``config`` may only be a mapping of overrides; ``allow_changes`` as --allow-changes); pass the same ``rewards``
    and ``problems`` it was started with (``from_intact`` as --from-intact: past a corrupt newest checkpoint).
    ``verbose`` (default): progress to stderr -- the slow phases (model load, first sampling, held-out evals,
    checkpoint writes) and one line per step with reward, loss, KL, entropy and step time. Everything the run is
    given is checked before any model is loaded; errors are GrpolabError subclasses with one-line messages.
    """
    from .config import TaskConfig
    from .errors import ConfigError, writable_dir
    from .models.checkpoint import latest_checkpoint
    from .runs import start_run
    from .training.builders import IN_MEMORY_TASK, in_memory_problems, is_dataset
    from .training.progress_lines import trainer_step_line

    rewards = dict(rewards or {})
    say = _say(verbose)
    if resume is not None:
        if Path(resume).is_dir():
            writable_dir(resume, "resume")
        trainer, manifest = _resume(
            Path(resume), config, rewards, problems, eval_problems, fields, allow_changes, from_intact, say
        )
    else:
        if from_intact:
            raise ConfigError("from_intact: only with resume=RUN_DIR")
        cfg = _with_run_dir(config if _is_config(config) else load_config(config), run_dir)
        writable_dir(cfg.run.output_dir, "run.output_dir")
        prepared = None
        if problems is not None:
            prepared = in_memory_problems(cfg, problems, eval_problems, fields)
            options = dict(fields or {}) if is_dataset(problems) else {}
            cfg = dataclasses.replace(cfg, task=TaskConfig(name=IN_MEMORY_TASK, options=options))
        elif eval_problems is not None or fields:
            raise ConfigError(
                "eval_problems / fields: only with problems=...; otherwise the config's task supplies them"
            )
        trainer, manifest = start_run(cfg, rewards=rewards, problems=prepared, progress=say)

    def step_done(step: int, m: dict[str, float]) -> None:
        if say:
            say(trainer_step_line(trainer, step, m))
        if on_step:
            on_step(step, m)

    metrics = trainer.fit(step_done)
    return TrainResult(
        run_dir=trainer.run_dir,
        metrics=metrics,
        checkpoint=latest_checkpoint(trainer.run_dir),
        manifest=manifest,
        steps=trainer.step,
    )


def _resume(
    run_dir: Path,
    overrides: Any,
    rewards: dict[str, Any],
    problems: Any,
    eval_problems: Any,
    fields: Mapping[str, Any] | None,
    allow_changes: bool,
    from_intact: bool,
    progress: Callable[[str], None] | None,
):
    """(trainer, manifest) of a resumed run (grpolab.runs.resume_run, with the in-memory problems prepared)."""
    from .errors import ConfigError
    from .manifest import read_manifest
    from .runs import resume_config, resume_run
    from .training.builders import IN_MEMORY_TASK, in_memory_problems

    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError(
            "config: with resume=RUN_DIR the config comes from its manifest; pass None or a mapping "
            "of overrides such as {'train.steps': 50}"
        )
    overrides = dict(overrides or {})
    cfg, _ = resume_config(run_dir, overrides)
    if cfg.task.name == IN_MEMORY_TASK and problems is None:
        raise ConfigError(
            f"problems: {run_dir} was trained on problems passed in memory; pass the same problems= "
            "(and eval_problems=) to resume it"
        )
    prepared = in_memory_problems(cfg, problems, eval_problems, fields) if problems is not None else None
    trainer, _ = resume_run(
        run_dir,
        overrides,
        allow_changes,
        rewards=rewards,
        problems=prepared,
        progress=progress,
        from_intact=from_intact,
    )
    return trainer, read_manifest(run_dir)


def _is_config(obj: Any) -> bool:
    from .config import Config

    return isinstance(obj, Config)


@quiet_unless_verbose
def evaluate_models(
    models: str | Sequence[str],
    task: str = "arithmetic",
    options: Mapping[str, Any] | None = None,
    split: str = "test",
    limit: int = 0,
    max_new_tokens: int = 64,
    batch_size: int = 64,
    samples: int = 0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    dtype: str = "float32",
    out: str | Path | None = None,
    verbose: bool = True,
) -> EvalReport:
    """Held-out accuracy of one or more models (hub id, path, run directory or bundled: alias) on a task's split, as
    `grpolab eval` (same defaults): bootstrap intervals, paired differences against the first model, the held-out
    check of every model's recorded training set. ``out``: also write the JSON there (checked writable, its folders
    created, before anything is evaluated). The settings, every model and its chat template are checked before the
    first model is evaluated. ``verbose``: one stderr line per generated batch."""
    from .errors import writable_file
    from .evaluation.eval_checks import check_dtype, check_eval_settings, check_models_loadable
    from .evaluation.heldout import run_eval

    names = [models] if isinstance(models, (str, Path)) else list(models)
    check_eval_settings(
        "",
        limit=limit,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        samples=samples,
        temperature=temperature,
        top_p=top_p,
    )
    check_dtype(dtype, prefix="")
    if out is not None:
        writable_file(out, "out")
    check_models_loadable([str(m) for m in names])
    say = _say(verbose)
    progress = (lambda what, done, total: say(f"eval {what}: {done}/{total} problems")) if say else None
    data = run_eval(
        [str(m) for m in names],
        task,
        dict(options or {}),
        split,
        limit,
        max_new_tokens,
        batch_size,
        dtype,
        samples=samples,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        progress=progress,
    )
    return EvalReport(data, write_result(out, data))


def compare(
    sources: str | Path | Sequence[str | Path], baseline: str = "", out: str | Path | None = None
) -> Comparison:
    """Runs and evaluation JSONs side by side per evaluation set, with paired differences and seed groups, as
    `grpolab compare`. ``baseline``: the reference row is the first whose label contains it."""
    from .errors import writable_file
    from .report.compare import compare_entries, load_entries

    if out is not None:
        writable_file(out, "out")
    paths = [Path(sources)] if isinstance(sources, (str, Path)) else [Path(s) for s in sources]
    data = compare_entries(load_entries(paths), baseline)
    return Comparison(data, write_result(out, data))


@quiet_unless_verbose
def release_report(
    run_dir: str | Path,
    baselines: Sequence[str] = (),
    thresholds: Mapping[str, float] | None = None,
    skip_safety: bool = False,
    safety_max_new_tokens: int = 64,
    safety_prompts: str | Path | None = None,
    capability_task: str | None = None,
    capability_n: int = 50,
    capability_options: Mapping[str, Any] | None = None,
    capability_max_new_tokens: int = 256,
    dtype: str = "float32",
    skip_diversity: bool = False,
    diversity_n: int | None = None,
    diversity_samples: int | None = None,
    waived: Sequence[str] = (),
    log: Callable[[str], None] | None = None,
    verbose: bool = True,
) -> Report:
    """The release report of a run (``"RUN:best"``: judged at its best checkpoint), as `grpolab report` (same defaults):
    writes report.html and report.md into the run directory and returns the verdict, the checks and the paths.
    ``thresholds``: {name: value} overrides.
    ``skip_diversity`` / ``diversity_n`` / ``diversity_samples``: the pass@k diversity check's switch, problems and
    samples per problem (grpolab.report.diversity; defaults as the CLI's). ``waived``: harm dimensions whose
    non-inferiority is waived, as the CLI's ``--waive`` (capability, capability:TASK, pass_at_k, safety).
    ``safety_prompts``: a JSONL file of harmful requests for the safety probe (as ``--safety-prompts``).
    ``log``: told each step of the report
    (its evaluations, the safety probe, ...); by default those lines go to stderr, or nowhere with ``verbose=False``.
    ``dtype`` and the run directory (writable) are checked before any model runs."""
    import dataclasses

    from .errors import writable_dir
    from .evaluation.eval_checks import check_dtype
    from .gate.thresholds import Thresholds
    from .report import ReportOptions, build_report
    from .report.diversity import DiversitySettings

    check_dtype(dtype, prefix="")
    opts = ReportOptions(
        baselines=list(baselines),
        thresholds=Thresholds().replace(dict(thresholds or {})),
        skip_safety=skip_safety,
        safety_max_new_tokens=safety_max_new_tokens,
        safety_prompts=Path(safety_prompts) if safety_prompts is not None else None,
        dtype=dtype,
        capability_task=capability_task or None,
        capability_n=capability_n,
        capability_options=dict(capability_options or {}),
        capability_max_new_tokens=capability_max_new_tokens,
        skip_diversity=skip_diversity,
        diversity=dataclasses.replace(
            DiversitySettings(),
            **{k: v for k, v in (("n_problems", diversity_n), ("samples", diversity_samples)) if v is not None},
        ),
        waived=tuple(waived),
    )
    run_path = Path(str(run_dir).removesuffix(":best"))
    if run_path.is_dir():
        writable_dir(run_path, "run_dir")
    data = build_report(Path(run_dir), opts, log=log or _say(verbose) or (lambda s: None))
    label, why = data["verdict"]
    return Report(verdict=label, reason=why, checks=list(data["checks"]), paths=dict(data["paths"]), data=data)


__all__ = [
    "Comparison",
    "EvalReport",
    "Report",
    "TrainResult",
    "compare",
    "evaluate_models",
    "load_config",
    "release_report",
    "train",
    "write_result",
]
