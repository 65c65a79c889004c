"""Run identity: resolved config, objective card, hashes, versions, git commit, seed, machine; and its diff."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

from .config import move_speed_fields
from .errors import GrpolabError
from .tasks.base import Problem, normalise_problem_text

MODEL_FILES = ("*.safetensors", "*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def hash_files(paths: Iterable[Path]) -> str:
    """sha256 over (name, content) of each file, in name order."""
    h = hashlib.sha256()
    for p in sorted(paths, key=lambda q: q.name):
        h.update(p.name.encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def hash_model_dir(path: str) -> dict[str, str | None]:
    """Weights and tokenizer hashes of a local model directory (None for a hub id not yet on disk)."""
    d = Path(path)
    if not d.is_dir():
        return {"weights": None, "tokenizer": None}
    weights = [p for pattern in MODEL_FILES for p in d.glob(pattern)]
    tok = [d / n for n in TOKENIZER_FILES if (d / n).is_file()]
    return {"weights": hash_files(weights) if weights else None, "tokenizer": hash_files(tok) if tok else None}


def problem_hashes(problems: Iterable[Problem]) -> list[str]:
    """sha256 of each normalised question text (used to prove held-out sets do not overlap training)."""
    return sorted({sha256_bytes(normalise_problem_text(p.question).encode())[:16] for p in problems})


def data_hash(problems: list[Problem]) -> str:
    """sha256 of every problem's uid, question and answer -- plus its task data (a code task's tests) and
    instruction where it has them, so answer tasks keep the hashes they always had."""

    def row(p: Problem) -> list:
        extra = [dict(p.data), p.instruction] if p.data else []
        return [p.uid, p.question, p.answer, *extra]

    return sha256_bytes(json.dumps([row(p) for p in problems], sort_keys=True).encode())


def reward_code_hash() -> str:
    root = Path(__file__).parent / "rewards"
    return hash_files(root.glob("*.py"))


def git_state() -> dict[str, Any]:
    """Commit and dirtiness of the working tree the code runs from (None outside a git checkout)."""
    cwd = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    if commit.returncode != 0:
        return {"commit": None, "dirty": None}
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for pkg in ("grpolab", "torch", "transformers", "math-verify", "peft", "reasoning-gym"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def machine() -> dict[str, Any]:
    """Where the run computes: OS and kernel, processor, CPU model (Linux: /proc/cpuinfo's "model name", the CPU
    kind that decides which kernels run) and CPU count. A resume compares them with the run's (grpolab.runs)."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
    }


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The first "model name" of /proc/cpuinfo (None where there is none: not Linux, or an ARM kernel's)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        return None
    return None


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_manifest(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "manifest.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        raise GrpolabError(f"{path}: no manifest.json; expected a run directory written by `grpolab train`") from None
    except json.JSONDecodeError as e:
        raise GrpolabError(f"{path}: not valid JSON ({e})") from None


SEMANTIC_SECTIONS = ("config", "objective", "judge", "hashes", "versions", "git", "world_size")
# where and how a run is written and watched: not what it computes (an old run resumes, a tracker can be added)
IGNORED_CONFIG_KEYS = {
    "config.run.name",
    "config.run.output_dir",
    "config.run.report_to",
    "config.run.mlflow_tracking_uri",
    "config.run.table_every_steps",
    "config.run.table_groups",
}
# how fast a run computes, never what (config.SpeedConfig): listed apart, by speed_differences
SPEED_PREFIX = "config.speed."


def _flatten(x: Any, prefix: str) -> dict[str, Any]:
    if isinstance(x, dict):
        out: dict[str, Any] = {}
        for k, v in x.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: x}


def _semantic(m: dict[str, Any]) -> dict[str, Any]:
    """The semantic sections of a manifest, flattened to dotted keys; a config recorded before the speed switches
    moved to ``speed:`` is read with them there (config.move_speed_fields)."""
    sections = {k: m.get(k) for k in SEMANTIC_SECTIONS}
    if isinstance(sections["config"], dict):
        sections["config"] = move_speed_fields(sections["config"], warn=False)
    return _flatten(sections, "")


def _differences(a: dict[str, Any], b: dict[str, Any], speed: bool) -> list[tuple[str, Any, Any]]:
    """A library version one manifest does not record at all (written before grpolab recorded that library) is not
    a difference; one recorded as None (not installed) against a version is."""
    fa, fb = _semantic(a), _semantic(b)
    keys = sorted(k for k in (set(fa) | set(fb)) - IGNORED_CONFIG_KEYS if k.startswith(SPEED_PREFIX) == speed)
    unrecorded = {k for k in keys if k.startswith("versions.") and (k not in fa or k not in fb)}
    return [(k, fa.get(k), fb.get(k)) for k in keys if fa.get(k) != fb.get(k) and k not in unrecorded]


def diff_manifests(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Every semantic difference (algorithm, sampler, reward code, data, model, tokenizer, chat template,
    versions) between two manifests, as (field path, value in a, value in b). The speed switches are not among
    them (speed_differences)."""
    return _differences(a, b, speed=False)


def speed_differences(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The speed switches (``config.speed.*``) that differ: the same objective computed another way. A field
    one manifest lacks (written before it existed) is compared as missing."""
    return _differences(a, b, speed=True)
