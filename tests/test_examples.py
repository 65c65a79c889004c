"""The examples run: examples/train_with_python_api.py at tiny scale, as a user runs it (a separate process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TQDM_DISABLE": "1",
    "OMP_NUM_THREADS": "1",
}


def test_python_api_example_trains_evaluates_and_reports(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "runs" / "example"
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "train_with_python_api.py"),
            "--tiny",
            tiny_model_dir,
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["step 1", "step 2"], out.stdout
    assert any(line.startswith("verdict: ") for line in lines), out.stdout
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["python_rewards"] == ["brevity"] and len(manifest["hashes"]["reward_functions"]["brevity"]) == 64
    assert manifest["hashes"]["dataset_fingerprint"] == manifest["data"]["source"]["fingerprint"]
    evaluation = json.loads((run_dir / "eval" / "base_vs_trained.json").read_text())
    assert [m["held_out"]["checked"] for m in evaluation["models"]] == [False, True]
    assert (run_dir / "report.html").is_file() and (run_dir / "checkpoints" / "step-2").is_dir()
