"""`grpolab release`: a run's release bundle, served by plain transformers in another process and compared with the
evaluation (serving_consistency), and its rollback target checked (rollback_ready) -- grpolab.serving."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from .app import app, console


@app.command()
def release(
    source: Annotated[
        Path,
        typer.Argument(help="run directory (bundles its evaluated checkpoint), or an existing bundle to check again"),
    ],
    out: Annotated[
        Optional[Path], typer.Option("--out", help="bundle directory to write (default RUN_DIR/release/bundle)")
    ] = None,
    dtype: Annotated[
        Optional[str],
        typer.Option(
            "--dtype", help="float32 or bfloat16 weights (default: the precision the held-out evaluation ran in)"
        ),
    ] = None,
    n: Annotated[
        int, typer.Option("--n", help="held-out problems the serving check answers (0: all the evaluation had)")
    ] = 0,
    rollback_to: Annotated[
        Optional[Path],
        typer.Option("--rollback-to", help="previous release bundle to roll back to (default: the run's base model)"),
    ] = None,
    rollback_n: Annotated[
        int, typer.Option("--rollback-n", help="held-out problems the rollback target answers again")
    ] = 32,
    skip_checks: Annotated[
        bool, typer.Option("--skip-checks", help="write the bundle only (the report's serving checks stay N/A)")
    ] = False,
    threshold: Annotated[
        Optional[list[str]], typer.Option("--threshold", help="NAME=VALUE, e.g. serving_divergence_warn=0.2")
    ] = None,
    stack: Annotated[
        str,
        typer.Option(
            "--stack",
            help="serving stack: transformers (serving.json), gguf (the bundle as a GGUF file served by llama.cpp: serving_gguf.json; needs `make install-gguf`), or both",
        ),
    ] = "transformers",
    gguf_type: Annotated[
        str, typer.Option("--gguf-type", help="GGUF tensor type for --stack gguf: f32, bf16 or f16")
    ] = "f32",
    serve_threads: Annotated[
        int,
        typer.Option(
            "--serve-threads",
            help="threads of the served stack (0: its default; llama.cpp: every core, slow on a core another job holds)",
        ),
    ] = 0,
) -> None:
    """Write the release bundle (weights with a LoRA merged, tokenizer, the run's chat template, a generation config
    with the run's end ids and sampling settings, release.json) and check it: served by plain transformers with no
    grpolab code, against grpolab's evaluation of the checkpoint; and the rollback target served and compared with
    its recorded score. Results: RUN_DIR/release/serving.json and rollback.json, read by `grpolab report`.
    With --stack gguf (or both) the bundle is also converted to a GGUF file (beside it: gguf/BUNDLE.TYPE.gguf) and served by
    llama.cpp: RUN_DIR/release/serving_gguf.json, graded in serving_consistency."""
    from ..serving.bundle import RELEASE_FILE, read_release, write_release

    check_release_options(source, out, dtype, n, rollback_n, serve_threads, stack, gguf_type)
    log = lambda s: console.print(s, highlight=False, soft_wrap=True)  # noqa: E731
    if (source / RELEASE_FILE).is_file():
        bundle = source
    else:
        bundle = write_release(source, out or source / "release" / "bundle", dtype)
        log(f"wrote the release bundle {bundle}")
    run_dir = Path(read_release(bundle)["source_run"])
    if skip_checks:
        return
    stacks = ("transformers", "gguf") if stack == "both" else (stack,)
    check_bundle(bundle, run_dir, stacks, n, serve_threads, gguf_type, rollback_to, rollback_n, threshold or [], log)


def check_bundle(
    bundle: Path,
    run_dir: Path,
    stacks: tuple[str, ...],
    n: int,
    serve_threads: int,
    gguf_type: str,
    rollback_to: Optional[Path],
    rollback_n: int,
    threshold: list[str],
    log: Callable[[str], None],
) -> None:
    """Serve the bundle on each stack and grade it (serving_consistency) as the report grades it, every stack whose
    result is there; serve the rollback target and grade it (rollback_ready); print both."""
    from ..gate.release import check_rollback_ready, check_serving_consistency
    from ..gate.thresholds import parse_thresholds
    from ..report.evidence import load_release_evidence
    from ..serving.check import run_serving_checks
    from ..serving.rollback import run_rollback_check

    t = parse_thresholds(threshold)
    # grpolab's own evaluation runs once for both stacks
    run_serving_checks(bundle, stacks, n, threads=serve_threads, log=log, gguf_type=gguf_type)
    evidence = load_release_evidence(run_dir)
    serving = check_serving_consistency(evidence["serving"], t, evidence["serving_gguf"])
    rollback = check_rollback_ready(
        run_rollback_check(run_dir, str(rollback_to) if rollback_to else None, rollback_n, log=log), t
    )
    for c in (serving, rollback):
        log(f"{c.status} {c.name}: {c.reason}")


def check_release_options(
    source: Path,
    out: Optional[Path],
    dtype: Optional[str],
    n: int,
    rollback_n: int,
    serve_threads: int,
    stack: str = "transformers",
    gguf_type: str = "f32",
) -> None:
    """The stack, numbers and dtype in range, and the places the bundle and the check results go writable, before
    any model is loaded (a read-only run directory is one error, not a traceback after the bundle was built)."""
    from ..errors import ConfigError, GrpolabError, writable_dir
    from ..evaluation.eval_checks import check_dtype
    from ..serving.gguf import GGUF_TYPES

    if stack not in ("transformers", "gguf", "both"):
        raise GrpolabError(f"--stack: expected transformers, gguf or both, got {stack!r}")
    if gguf_type not in GGUF_TYPES:
        raise GrpolabError(f"--gguf-type: expected one of {', '.join(GGUF_TYPES)}, got {gguf_type!r}")
    if dtype is not None:
        check_dtype(dtype)
    for option, value, low, meaning in (
        ("--n", n, 0, " (0 = every problem the evaluation had)"),
        ("--rollback-n", rollback_n, 1, ""),
        ("--serve-threads", serve_threads, 0, " (0 = the stack's default)"),
    ):
        if value < low:
            raise ConfigError(f"{option}: expected an integer >= {low}{meaning}, got {value}")
    if (source / "manifest.json").is_file():
        writable_dir(source / "release", "release")
    if out is not None and not out.exists():
        writable_dir(out.parent, "--out")
