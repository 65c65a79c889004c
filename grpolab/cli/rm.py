"""`grpolab rm train`: a Bradley-Terry reward model from preference pairs (grpolab.reward_model)."""

from __future__ import annotations

from typing import Annotated

import typer

from .app import _show_warnings, app, console

rm_app = typer.Typer(no_args_is_help=True, help="Reward models: train one for the `model` reward.")
app.add_typer(rm_app, name="rm")


@rm_app.command("train")
def rm_train(
    pairs: Annotated[str, typer.Option(help="JSONL of preference pairs: prompt, chosen, rejected per row")] = "",
    task: Annotated[str, typer.Option(help="or build pairs from this task's training problems and its verifier")] = "",
    task_option: Annotated[list[str], typer.Option("--task-option", help="task option KEY=VALUE; repeatable")] = [],
    backbone: Annotated[
        str, typer.Option(help="causal LM the scalar head goes on (hub id, path, bundled:)")
    ] = "bundled:smollm2-135m-instruct",
    sampler: Annotated[str, typer.Option(help="model whose samples make task pairs (default: the backbone)")] = "",
    num_problems: Annotated[int, typer.Option(help="training problems sampled for task pairs")] = 128,
    samples_per_problem: Annotated[int, typer.Option(help="completions sampled per problem")] = 8,
    max_new_tokens: int = 48,
    temperature: float = 0.8,
    max_pairs_per_problem: int = 4,
    val_fraction: Annotated[float, typer.Option(help="share of prompts held out for pair accuracy")] = 0.2,
    epochs: int = 1,
    batch_size: Annotated[int, typer.Option(help="pairs per optimizer step")] = 8,
    lr: float = 1e-5,
    max_length: Annotated[int, typer.Option(help="tokens kept (the last ones) per text")] = 512,
    lora_rank: Annotated[int, typer.Option(help="LoRA rank through peft (0 = full fine-tuning)")] = 0,
    lora_alpha: float = 16.0,
    seed: int = 0,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    output_dir: str = "runs",
    name: Annotated[str, typer.Option(help="run directory name (default rm-<task>-<time>)")] = "",
) -> None:
    """Train a Bradley-Terry reward model; report held-out pair accuracy; write a run directory whose path is a
    valid `reward.model.path`."""
    from ..config import parse_option
    from ..reward_model.train import RMSettings, summary_line, train_reward_model

    _show_warnings()
    settings = RMSettings(
        backbone=backbone,
        pairs=pairs,
        task=task,
        task_options=dict(parse_option(o) for o in task_option),
        sampler=sampler,
        num_problems=num_problems,
        samples_per_problem=samples_per_problem,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        max_pairs_per_problem=max_pairs_per_problem,
        val_fraction=val_fraction,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        max_length=max_length,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        seed=seed,
        device=device,
        output_dir=output_dir,
        name=name,
    )
    out = train_reward_model(settings, on_log=lambda s: console.print(f"[dim]{s}[/]"))
    data = out["data"]
    if "sample_accuracy" in data:
        console.print(
            f"pairs: {data['pairs']} from {data['problems_with_pairs']} of {data['problems']} training "
            f"problems (sample accuracy {data['sample_accuracy']:.3f}; {data['held_out_checked']} held-out "
            "problems checked disjoint)",
            highlight=False,
            soft_wrap=True,
        )
    console.print(summary_line(out["result"]), highlight=False, soft_wrap=True)
    console.print(f"wrote {out['run_dir']} (use it as reward.model.path)", highlight=False, soft_wrap=True)
