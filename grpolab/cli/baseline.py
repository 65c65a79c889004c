"""`grpolab baseline ppo|dpo CONFIG`: PPO with a critic and DPO on the same problems and budget as a GRPO run.

Both read a GRPO config (a YAML file, or with ``--match-run RUN`` the config recorded in RUN's manifest) and keep its
model, task, reward, sampling and step budget (grpolab.baselines.sft_bon.budget_statement prints it):

- ppo: the same config with ``algorithm.estimator=gae`` and ``algorithm.kl_placement=reward`` (grpolab.baselines.ppo): a run
  directory like GRPO's, as many sampled completions and optimizer steps;
- dpo: as many sampled completions as the GRPO run (train.steps x prompts_per_step x group_size) from the base model
  on training problems, paired by the training reward, then train.steps x mu x minibatches DPO steps (grpolab.baselines.dpo).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import GrpolabError
from .app import _show_warnings, baseline_app, console


def _config(config: Optional[Path], match_run: Optional[Path], overrides: list[str]):
    """The GRPO config to match: CONFIG, or RUN's recorded config; --set overrides applied on top."""
    from ..config import from_dict, load_config, parse_override, set_path
    from ..manifest import read_manifest

    if (config is None) == (match_run is None):
        raise GrpolabError("give a CONFIG file or --match-run RUN (the GRPO run to match), not both")
    if config is not None:
        return load_config(config, overrides)
    raw = read_manifest(match_run)["config"]
    for key, value in map(parse_override, overrides):
        set_path(raw, key, value)
    return from_dict(raw)


@baseline_app.command("ppo")
def ppo(
    config: Annotated[Optional[Path], typer.Argument(help="the GRPO YAML config to match")] = None,
    match_run: Annotated[Optional[Path], typer.Option(help="or: the GRPO run whose recorded config to match")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override a field, e.g. --set critic.lr=2e-5")] = [],
) -> None:
    """PPO with a learned critic (GAE, value clipping, per-token KL in the reward) on the GRPO run's budget."""
    from ..baselines.sft_bon import budget_statement
    from ..runs import start_run

    _show_warnings()
    base = _config(config, match_run, set_)
    stem = match_run.name if match_run else (base.run.name or Path(config).stem)
    extra = ["algorithm.estimator=gae", "algorithm.kl_placement=reward", *set_]
    if not any(s.startswith("run.name=") for s in set_):
        extra.append(f"run.name={stem}-ppo")
    cfg = _config(config, match_run, extra)
    trainer, _ = start_run(cfg)
    console.print(f"[bold]run[/] {trainer.run_dir}  {budget_statement(cfg)}", highlight=False, soft_wrap=True)

    def line(step: int, m: dict[str, float]) -> None:
        console.print(
            f"step {step}/{cfg.train.steps}  reward {m['reward/mean']:.3f}  value loss {m['value/loss']:.4f}  "
            f"{m['time/step_s']:.1f}s/step",
            highlight=False,
        )
        console.file.flush()

    trainer.fit(line)
    console.print(
        f"[green]done[/] {trainer.run_dir}  (evaluate it with: grpolab eval BASE {trainer.run_dir} --task "
        f"{cfg.task.name} ...)",
        highlight=False,
        soft_wrap=True,
    )


@baseline_app.command("dpo")
def dpo(
    out: Annotated[Path, typer.Option(help="new directory for the DPO-trained HF checkpoint")],
    config: Annotated[Optional[Path], typer.Argument(help="the GRPO YAML config to match")] = None,
    match_run: Annotated[Optional[Path], typer.Option(help="or: the GRPO run whose recorded config to match")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override a field of the matched config")] = [],
    loss: Annotated[str, typer.Option(help="sigmoid (DPO) or ipo")] = "sigmoid",
    beta: float = 0.1,
    batch_size: Annotated[int, typer.Option(help="pairs per optimizer step")] = 8,
    lr: Annotated[Optional[float], typer.Option(help="learning rate (default: the config's train.lr)")] = None,
    completions: Annotated[Optional[int], typer.Option(help="completions to sample (default: the GRPO run's)")] = None,
    steps: Annotated[Optional[int], typer.Option(help="optimizer steps (default: the GRPO run's)")] = None,
    pairs_per_problem: Annotated[int, typer.Option(help="at most this many pairs per problem (0 = all)")] = 0,
) -> None:
    """DPO on pairs of the base model's own samples (training problems, ranked by the training reward)."""
    from ..baselines.dpo import DPOSettings, run_dpo
    from ..baselines.sft_bon import budget_statement, grpo_budget

    _show_warnings()
    if loss not in ("sigmoid", "ipo"):
        raise GrpolabError(f"--loss: expected 'sigmoid' or 'ipo', got {loss!r}")
    if beta <= 0:
        raise GrpolabError(f"--beta: expected a number > 0, got {beta}")
    cfg = _config(config, match_run, set_)
    budget = grpo_budget(cfg)
    s = DPOSettings(
        loss=loss,
        beta=beta,
        batch_size=batch_size,
        lr=lr or cfg.train.lr,
        seed=cfg.train.seed,
        completions=completions or budget["completions_sampled"],
        steps=steps or budget["optimizer_steps"],
        pairs_per_problem=pairs_per_problem,
    )
    console.print(f"[bold]dpo[/] matching {budget_statement(cfg)}", highlight=False, soft_wrap=True)
    m = run_dpo(cfg, s, out)
    p = m["pairs"]
    console.print(
        f"{m['method']}: {p['completions_sampled']} completions sampled on {p['problems_sampled']} training "
        f"problems -> {p['pairs']} pairs ({p['problems_with_pairs']} problems), {s.steps} steps; loss "
        f"{m['steps'][0]['loss']:.3f} -> {m['steps'][-1]['loss']:.3f} ({m['seconds']:.0f}s)",
        highlight=False,
    )
    console.print(
        f"wrote {out}  (evaluate it with: grpolab eval BASE {out} --task {cfg.task.name} ...)", highlight=False
    )


@baseline_app.command("agent-sft")
def agent_sft(
    out: Annotated[Path, typer.Option(help="new directory for the fine-tuned HF checkpoint (a GRPO run's model.name)")],
    model: Annotated[str, typer.Option(help="base model")] = "bundled:smollm2-135m-instruct",
    task_option: Annotated[
        list[str],
        typer.Option(
            "--task-option", help="agent task option KEY=VALUE (env=... required; the bounds as in the GRPO config)"
        ),
    ] = [],
    steps: Annotated[int, typer.Option(help="optimizer steps")] = 60,
    batch_size: int = 8,
    lr: float = 5e-5,
    seed: int = 0,
    limit: Annotated[int, typer.Option(help="use the first N training states (0 = all num_train)")] = 0,
    precision: Annotated[str, typer.Option(help="fp32, bf16 or auto (measured, as train.precision)")] = "fp32",
    task: Annotated[
        str, typer.Option(help="agent (grpolab's tool syntax) or openai_agent (the task's agent, the model's format)")
    ] = "agent",
) -> None:
    """Supervised warm start of an agent task: fine-tune on the environment's expert episodes (training states
    only), the loss on the expert's tokens only (the episode loss mask); grpolab.baselines.agent_sft."""
    from ..baselines.agent_sft import AgentSFTSettings, run_agent_sft
    from ..config import parse_option

    options = dict(parse_option(o) for o in task_option)
    if "env" not in options:
        raise GrpolabError("baseline agent-sft: give the environment, e.g. --task-option env=lookup")
    s = AgentSFTSettings(steps=steps, batch_size=batch_size, lr=lr, seed=seed, precision=precision)
    m = run_agent_sft(
        model, options, s, out, limit=limit, log=lambda line: console.print(line, highlight=False), task=task
    )
    console.print(
        f"{m['method']}: {m['num_examples']} expert episodes ({m['unsolved_by_expert']} unsolved left out) "
        f"from {m['num_problems']} training states, {steps} steps, loss {m['loss_before']:.3f} -> "
        f"{m['loss_after']:.3f} ({m['seconds']:.0f}s)",
        highlight=False,
    )
    console.print(f"wrote {out}  (train from it: grpolab train CONFIG --set model.name={out})", highlight=False)
