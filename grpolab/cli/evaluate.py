"""`grpolab eval`, `grpolab compare`, `grpolab baseline` (sft, best-of-n).

`compare` rules:
- A source is an evaluation JSON (written by `grpolab eval --out` or `grpolab baseline best-of-n --out`) or a run
  directory: every ``eval/*.json`` in it, or, when none exists, its last periodic held-out eval from
  metrics.jsonl (accuracy and interval only; no per-problem records, so no paired difference).
- Rows are grouped by evaluation set (``data_hash``); only rows on the same set are put side by side. The same
  (model path, method, samples, set) seen twice is shown once. The reference of each set is the first row, or
  the first whose label contains ``--baseline``; differences are paired over the problems both have (t intervals; docs/evaluation.md).
- Runs whose manifests differ only in ``config.train.seed`` (and the git state; grpolab.evaluation.sets.recipe_groups),
  evaluated on the same set with the same method, form a seed group: mean, sample std (ddof 1), min and max of every
  metric, and -- when every run kept its per-problem records -- the mean over runs and problems with the
  hierarchical interval and the gain over each run's base (grpolab.evaluation.sets.set_evidence).
- ``--set NAME=SRC,SRC,...`` (repeatable) names the sets: each source's trained row (in a run directory, the row of
  that run; in an eval JSON, its last row) is a member. Every set after the first is compared with the first: the
  difference of means with the hierarchical interval (runs resampled within each set, problems jointly).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, Sequence

import typer
from rich.console import Console
from rich.table import Table

from ..errors import GrpolabError, writable_file
from .app import app, baseline_app, console

WIDE = 250  # columns for a table printed to a file or a pipe (rich would squeeze it into 80)


def show(table: Table) -> None:
    """Print a table: as wide as the terminal, or up to WIDE columns in a log (not folded into 80)."""
    if console.is_terminal:
        console.print(table)
    else:
        Console(file=console.file, width=WIDE, no_color=True).print(table)


@contextmanager
def eval_progress(models: Sequence[str] = ()):
    """A Progress (grpolab.evaluation.heldout) for a long evaluation: a status line on a terminal; one plain line per batch,
    flushed, in a file or a pipe, so a log is never silent for minutes. The seconds shown are the current model's
    own (model_clock), not the command's."""
    seconds = model_clock(models)
    text = lambda what, done, total: f"eval {what}: {done}/{total} problems, {seconds(what):.0f}s"  # noqa: E731
    if console.is_terminal:
        with console.status("eval: loading") as status:
            yield lambda what, done, total: status.update(text(what, done, total))
        return

    def line(what: str, done: int, total: int) -> None:
        console.print(text(what, done, total), highlight=False, soft_wrap=True)
        console.file.flush()

    yield line


def model_clock(models: Sequence[str], clock: Callable[[], float] = time.perf_counter) -> Callable[[str], float]:
    """seconds(what): time spent on the model that `what` ("<model> greedy", "<model> 8 samples") names, counted
    from the previous model's last report (its load included), or from the start for the first model.

    >>> ticks = iter([0.0, 5.0, 9.0, 12.0]); s = model_clock(["a", "b"], lambda: next(ticks))
    >>> s("a greedy"), s("b greedy"), s("b 8 samples")
    (5.0, 4.0, 7.0)
    """
    state = {"model": None, "start": clock(), "last": None}

    def seconds(what: str) -> float:
        now = clock()
        model = next((m for m in models if what == m or what.startswith(f"{m} ")), what)
        if model != state["model"]:
            state["start"] = state["last"] if state["last"] is not None else state["start"]
            state["model"] = model
        state["last"] = now
        return now - state["start"]

    return seconds


def _options(task_option: list[str]) -> dict[str, Any]:
    from ..config import parse_option

    return dict(parse_option(o) for o in task_option)


def _ci(m: dict[str, float]) -> str:
    return f"{m['mean']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]" if "ci_low" in m else f"{m['mean']:.3f}"


def _write(out: Optional[Path], data: dict[str, Any]) -> None:
    from ..evaluation.result import write_result  # the file grpolab.evaluate_models / grpolab.compare write with out=

    if write_result(out, data):
        console.print(f"wrote {out}")


def print_eval(result: dict[str, Any]) -> None:
    """Console tables of an evaluation JSON: one row per model, then accuracy per slice."""
    dec = result["decoding"]
    how = "greedy" + (f" + {dec['samples']} samples at T={dec['temperature']}" if dec.get("samples") else "")
    metric = str(result.get("metric", "math-verify")).split(" (")[0]
    table = Table(title=f"{result['task']} / {result['split']}  (n = {result['n']}, {how}, {metric})")
    extra = [
        m for m in result["models"][0]["metrics"] if m != "accuracy" and "ci_low" in result["models"][0]["metrics"][m]
    ]
    for col in ("model", "accuracy [95% CI]", "Δ vs first [95% CI]", *extra, "len", "trunc", "problems/s"):
        table.add_column(col)
    for r in result["models"]:
        diff = r.get("paired_vs_first", {}).get("accuracy")
        table.add_row(
            r["model"],
            _ci(r["metrics"]["accuracy"]),
            _ci(diff) if diff else "-",
            *[f"{r['metrics'][m]['mean']:.3f}" if m in r["metrics"] else "-" for m in extra],
            f"{r['len_mean']:.1f}",
            f"{r['truncated_frac']:.2f}",
            f"{r['problems_per_s']:.2f}",
        )
    show(table)
    console.print(f"evaluation set hash {result['data_hash'][:16]}")
    for r in result["models"]:
        h = r["held_out"]
        what = (
            f"{h['train_problems']} training problems in {h['manifest']}, none evaluated" if h["checked"] else h["note"]
        )
        console.print(f"held-out check, {r['model']}: {what}", highlight=False)
    slices = sorted({s for r in result["models"] for s in r["per_slice"]})
    if len(slices) > 1:
        st = Table(title="accuracy per slice [95% CI]")
        st.add_column("slice")
        st.add_column("n")
        for r in result["models"]:
            st.add_column(r["model"], overflow="fold")
        for s in slices:
            cells = [
                _ci(r["per_slice"][s]["metrics"]["accuracy"]) if s in r["per_slice"] else "-" for r in result["models"]
            ]
            st.add_row(s, str(result["models"][0]["per_slice"].get(s, {}).get("n", "-")), *cells)
        show(st)
    for group in result.get("sets", []):
        show_set(f"set of {len(group['runs'])} runs, seeds {group['seeds']}: gain over {group['reference']}", group)


def _span(d: dict[str, Any], sign: str = "") -> str:
    return f"{d['mean']:{sign}.3f} [{d['ci_low']:{sign}.3f}, {d['ci_high']:{sign}.3f}]"


def show_set(title: str, group: dict[str, Any]) -> None:
    """One set of runs: per metric, the mean over runs and problems and the gain over the reference, each with its
    hierarchical 95% interval, and the between-run spread of the gain (or of the value without a reference)."""
    t = Table(title=title + "  (95% CI over runs and problems)")
    for col in ("metric", "mean [95% CI]", "gain [95% CI]", "per run", "std", "min", "max"):
        t.add_column(col)
    for m, v in group["metrics"].items():
        g = v.get("gain") or v["value"]
        s = g["spread"]
        t.add_row(
            m,
            _span(v["value"]),
            _span(v["gain"], "+") if "gain" in v else "-",
            ", ".join(f"{x:+.3f}" if "gain" in v else f"{x:.3f}" for x in g["per_run"]),
            "-" if s["std"] is None else f"{s['std']:.3f}",
            f"{s['min']:+.3f}",
            f"{s['max']:+.3f}",
        )
    show(t)


@app.command("eval")
def eval_(
    models: Annotated[list[str], typer.Argument(help="model: hub id, path, run directory or bundled: alias")],
    task: Annotated[str, typer.Option(help="task name")] = "arithmetic",
    task_option: Annotated[list[str], typer.Option("--task-option", help="task option KEY=VALUE")] = [],
    split: str = "test",
    limit: Annotated[int, typer.Option(help="evaluate the first N problems (0 = all)")] = 0,
    max_new_tokens: int = 64,
    batch_size: Annotated[int, typer.Option(help="sequences per generate call")] = 64,
    samples: Annotated[
        int, typer.Option(help="k samples per problem for pass@k / maj@k / mean@k (0 = greedy only)")
    ] = 0,
    temperature: Annotated[float, typer.Option(help="sampling temperature (with --samples)")] = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    dtype: Annotated[
        str, typer.Option(help="float32 or bfloat16 (bf16 pays only on CPUs with bf16 matrix units, and GPUs)")
    ] = "float32",
    out: Annotated[Optional[Path], typer.Option(help="write the JSON result here")] = None,
) -> None:
    """Held-out accuracy (math-verify) with 95% intervals (t over problems; bootstrap-t for graded pass@k) and paired
    differences, for one or more models; several run directories of one recipe (seeds) also give the set's mean gain over runs and problems."""
    from ..evaluation.eval_checks import check_dtype, check_eval_settings, check_models_loadable
    from ..evaluation.heldout import run_eval

    check_eval_settings(
        limit=limit,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        samples=samples,
        temperature=temperature,
        top_p=top_p,
    )
    check_dtype(dtype)
    if out is not None:
        writable_file(out, "--out")  # before the evaluation, not after it (parents created)
    options = _options(task_option)
    check_models_loadable(models)  # every model's chat template before the first one is evaluated
    with eval_progress(models) as progress:
        result = run_eval(
            models,
            task,
            options,
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
    print_eval(result)
    _write(out, result)


# ------------------------------------------------------------------------------------------------ baselines


@baseline_app.command("best-of-n")
def best_of_n(
    model: Annotated[str, typer.Argument(help="model: hub id, path, run directory or bundled: alias")],
    n: Annotated[int, typer.Option(help="samples per problem")] = 8,
    reward_weight: Annotated[list[str], typer.Option("--reward-weight", help="training reward NAME=WEIGHT")] = [],
    reward_from: Annotated[
        Optional[Path],
        typer.Option(help="rank by the reward this run was trained with (its manifest's weights and functions)"),
    ] = None,
    task: str = "arithmetic",
    task_option: Annotated[list[str], typer.Option("--task-option", help="task option KEY=VALUE")] = [],
    split: str = "test",
    limit: int = 0,
    max_new_tokens: int = 64,
    batch_size: int = 64,
    temperature: float = 1.0,
    seed: int = 0,
    dtype: str = "float32",
    out: Annotated[Optional[Path], typer.Option(help="write the JSON result here")] = None,
) -> None:
    """Sample n, keep the answer the training reward ranks highest, score it with math-verify."""
    from ..baselines.sft_bon import best_of_n_eval
    from ..config import RewardConfig, number_map
    from ..evaluation.eval_checks import check_dtype, check_eval_settings
    from ..evaluation.heldout import eval_header, load_eval_problems, model_row
    from ..evaluation.overlap import check_held_out
    from ..models.load import DTYPES, load_causal_lm, load_tokenizer, resolve_model_path
    from ..rewards import RewardSet
    from ..rollout.grpolab_engine import GrpolabEngine
    from .score import run_reward

    check_eval_settings(n=n, limit=limit, max_new_tokens=max_new_tokens, batch_size=batch_size, temperature=temperature)
    check_dtype(dtype)
    if out is not None:
        writable_file(out, "--out")
    weights = dict(RewardConfig().weights)
    rewards: dict[str, float] | RewardSet = weights
    if reward_from:  # the run's whole reward: its weights with its own functions, reward model and judge
        weights, rewards = run_reward(reward_from, {})
    if reward_weight:
        weights = rewards = number_map("--reward-weight", _options(reward_weight), sep=" ")
    options = _options(task_option)
    problems = load_eval_problems(task, options, split, limit)
    path = resolve_model_path(model)
    held_out = check_held_out(model, path, problems)
    tok, lm = load_tokenizer(path), load_causal_lm(path, dtype)
    res = best_of_n_eval(
        GrpolabEngine(lm, tok, DTYPES[dtype]), tok, problems, n, rewards, temperature, max_new_tokens, batch_size, seed
    )
    decoding = {
        "greedy": False,
        "samples": n,
        "temperature": temperature,
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "selection": {"reward_weights": weights},
    }
    result = {
        **eval_header(task, options, split, problems, dtype, decoding),
        "models": [model_row(f"{model} best-of-{n}", path, res, held_out, "best_of_n")],
    }
    print_eval(result)
    _write(out, result)


@baseline_app.command("sft")
def sft(
    out: Annotated[Path, typer.Option(help="new directory for the fine-tuned HF checkpoint")],
    model: Annotated[Optional[str], typer.Option(help="base model (default: the --match-run's model)")] = None,
    match_run: Annotated[
        Optional[Path], typer.Option(help="GRPO run whose model, task and optimizer-step budget to match")
    ] = None,
    mode: Annotated[str, typer.Option(help="gold (gold solutions) or rft (own correct samples)")] = "gold",
    steps: Annotated[
        Optional[int], typer.Option(help="optimizer steps (default: the run's steps * mu * minibatches)")
    ] = None,
    task: Optional[str] = None,
    task_option: Annotated[list[str], typer.Option("--task-option", help="task option KEY=VALUE")] = [],
    limit: Annotated[int, typer.Option(help="use the first N train problems (0 = all)")] = 0,
    batch_size: int = 8,
    lr: float = 1e-5,
    seed: int = 0,
    precision: Annotated[str, typer.Option(help="fp32, bf16 or auto (measured, as train.precision)")] = "auto",
    rft_samples: int = 4,
    rft_temperature: float = 1.0,
    max_new_tokens: int = 64,
) -> None:
    """Fine-tune the base model on gold solutions or on its own correct samples (RFT), same step budget as GRPO."""
    from ..baselines.sft_bon import SFTSettings, run_sft
    from ..manifest import read_manifest

    run_cfg = read_manifest(match_run)["config"] if match_run else None
    model = model or (run_cfg["model"]["name"] if run_cfg else None)
    task = task or (run_cfg["task"]["name"] if run_cfg else None)
    options = _options(task_option) if task_option or not run_cfg else dict(run_cfg["task"]["options"])
    if steps is None and run_cfg:
        t = run_cfg["train"]
        steps = t["steps"] * t.get("mu", 1) * t.get("minibatches", 1)
    if not model or not task or not steps:
        raise GrpolabError("baseline sft: give --match-run RUN, or --model, --task and --steps")
    s = SFTSettings(
        mode=mode,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        precision=precision,
        rft_samples=rft_samples,
        rft_temperature=rft_temperature,
        max_new_tokens=max_new_tokens,
    )
    m = run_sft(model, task, options, s, out, limit=limit)
    console.print(
        f"{m['method']}: {m['num_examples']} examples from {m['num_problems']} problems, {steps} steps, "
        f"loss {m['loss_before']:.3f} -> {m['loss_after']:.3f} ({m['seconds']:.0f}s)"
    )
    console.print(f"wrote {out}  (evaluate it with: grpolab eval {out} --task {task} --split test)")


# ------------------------------------------------------------------------------------------------ compare


def parse_sets(specs: list[str]) -> dict[str, list[Path]]:
    """['a=runs/a0,runs/a1', 'b=runs/b0'] -> {'a': [runs/a0, runs/a1], 'b': [runs/b0]}."""
    out: dict[str, list[Path]] = {}
    for spec in specs:
        name, sep, srcs = spec.partition("=")
        paths = [Path(p) for p in srcs.split(",") if p]
        if not sep or not name or not paths or name in out:
            raise GrpolabError(f"--set {spec!r}: expected a new NAME=SOURCE,SOURCE,... (run directories or eval JSONs)")
        out[name] = paths
    return out


@app.command("compare")
def compare(
    sources: Annotated[
        Optional[list[Path]], typer.Argument(help="run directories and/or evaluation JSON files")
    ] = None,
    baseline: Annotated[str, typer.Option(help="reference row: the first whose label contains this")] = "",
    set_: Annotated[
        list[str],
        typer.Option(
            "--set", help="a set of runs: NAME=SOURCE,SOURCE,...; repeatable; every set is compared with the first"
        ),
    ] = [],
    out: Annotated[Optional[Path], typer.Option(help="write the comparison JSON here")] = None,
) -> None:
    """Runs and baselines side by side on the same held-out problems; mean and spread across seeds; sets of runs
    (two recipes over several seeds each) compared by the difference of means over runs and problems."""
    from ..baselines.sft_bon import budget_cells
    from ..report.compare import compare_entries, load_entries, named_sets

    named = parse_sets(set_)
    if not sources and not named:
        raise GrpolabError(
            "compare: give run directories or eval JSONs, or --set NAME=SOURCE,... (twice for two recipes)"
        )
    if out is not None:
        writable_file(out, "--out")
    result = compare_entries(load_entries(list(sources or []) + [p for ps in named.values() for p in ps]), baseline)
    if named:
        result.update(named_sets(named))
    for s in result["eval_sets"]:
        names = list(
            dict.fromkeys(m for r in s["rows"] for m, v in r["metrics"].items() if m != "accuracy" and "ci_low" in v)
        )
        t = Table(title=f"{s['task']} / {s['split']}  set {s['data_hash'][:10]}  (reference: {s['reference']})")
        budget = ("wall", "peak mem", "completions", "opt steps")  # grpolab.baselines.sft_bon.entry_budget
        for col in (
            "run / model",
            "method",
            "n",
            "accuracy [95% CI]",
            "Δ vs ref [95% CI]",
            *names,
            "len",
            "trunc",
            *budget,
        ):
            t.add_column(col, overflow="fold")
        for r in s["rows"]:
            d = r["diff_vs_reference"].get("accuracy")
            t.add_row(
                r["label"],
                str(r["method"]),
                str(r["n"]),
                _ci(r["metrics"]["accuracy"]),
                _ci(d) if d else "-",
                *[f"{r['metrics'][m]['mean']:.3f}" if m in r["metrics"] else "-" for m in names],
                f"{r['len_mean']:.1f}",
                f"{r['truncated_frac']:.2f}",
                *budget_cells(r.get("budget")),
            )
        show(t)
    for g in result["seed_groups"]:
        title = f"across {g['n_seeds']} seeds {g['seeds']}: {', '.join(g['runs'])}"
        if g["evidence"]:
            show_set(title, {"metrics": g["evidence"]})
            continue
        t = Table(title=title + " (no per-problem records: spread only)")
        for col in ("metric", "mean", "std", "min", "max"):
            t.add_column(col)
        for m, v in g["metrics"].items():
            t.add_row(
                m,
                f"{v['mean']:.3f}",
                "-" if v["std"] is None else f"{v['std']:.3f}",
                f"{v['min']:.3f}",
                f"{v['max']:.3f}",
            )
        show(t)
    print_named_sets(result)
    _write(out, result)


def print_named_sets(result: dict[str, Any]) -> None:
    """The --set evidence: each set's table, then every difference of means (B - A) with its interval."""
    for s in result.get("sets", []):
        for e in s["eval_sets"]:
            show_set(f"set {s['name']} ({len(s['runs'])} runs) on {e['task']} set {e['data_hash'][:10]}", e)
    for d in result.get("set_differences", []):
        t = Table(
            title=f"{d['b']} - {d['a']} on {d['task']} set {d['data_hash'][:10]}  (difference of means over runs; "
            "95% CI over runs and problems)"
        )
        for col in ("metric", f"{d['a']} mean", f"{d['b']} mean", "difference [95% CI]", "runs", "problems"):
            t.add_column(col)
        for m, v in d["metrics"].items():
            t.add_row(
                m,
                f"{v['a']['mean']:.3f}",
                f"{v['b']['mean']:.3f}",
                _span(v, "+"),
                f"{v['a']['runs']} vs {v['b']['runs']}",
                str(v["n"]),
            )
        show(t)
