"""The layering contracts (pyproject.toml, run by `make test` through lint-imports) hold, and can fail: a planted
upward import in a copy of the package breaks the contract that names it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def planted(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess:
    shutil.copytree(ROOT / "grpolab", tmp_path / "grpolab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "grpolab" / module
    target.write_text(target.read_text() + f"\n{line}\n")
    return lint(tmp_path)


def test_the_tree_keeps_every_contract():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout


def test_algo_importing_the_config_breaks_its_contract(tmp_path):
    result = planted(tmp_path, "algo/kl.py", "from grpolab import config  # planted")
    assert result.returncode == 1
    assert "algo/ is pure math" in result.stdout and "BROKEN" in result.stdout
    assert "grpolab.algo.kl -> grpolab.config" in result.stdout


def test_held_out_scoring_importing_a_reward_breaks_its_contract(tmp_path):
    result = planted(tmp_path, "evaluation/scoring.py", "from grpolab.rewards import math as _m  # planted")
    assert result.returncode == 1
    assert "Held-out scoring never imports the training rewards" in result.stdout


def test_the_api_importing_the_cli_breaks_the_layers(tmp_path):
    result = planted(tmp_path, "api.py", "import grpolab.cli  # planted")
    assert result.returncode == 1
    assert "grpolab.api -> grpolab.cli" in result.stdout
