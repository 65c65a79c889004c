"""A refactor changes nothing for users: short real runs fingerprinted before and after a change.

Each case trains the bundled model for a few steps through the CLI and prints one JSON line per case: the sha256 of
the run's samples (samples.jsonl), of every metric that is not a time, throughput or memory reading, and of the final
weights (the checkpoint's safetensors files). Run it on the commit before a change and on the change, and compare:

    python benchmarks/behaviour_fingerprint.py --out /tmp/before.json          # on the old commit
    python benchmarks/behaviour_fingerprint.py --out /tmp/after.json --compare /tmp/before.json

Cases: the quickstart in fp32 and in bf16 (3 steps), the agent quickstart (3 steps), an asynchronous run
(rollout.max_staleness 1 over grpolab's worker process, 3 steps), and a vLLM run where its venv is installed.
Metrics that a change adds are reported as added, not as a difference (an earlier metric must keep its value).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VOLATILE = ("time/", "throughput/", "memory/", "async/wait", "sync/")

COMMON = ["--set", "train.steps=3", "--set", "eval.every_steps=0", "--set", "train.save_every=3"]
CASES = {
    "quickstart_fp32": ["configs/quickstart.yaml", "--set", "train.precision=fp32", "--set", "rollout.dtype=float32"],
    "quickstart_bf16": ["configs/quickstart.yaml", "--set", "train.precision=bf16", "--set", "rollout.dtype=bfloat16"],
    "agent_quickstart": [
        "configs/agent_quickstart.yaml",
        "--set",
        "train.precision=fp32",
        "--set",
        "rollout.dtype=float32",
    ],
    "async_worker": [
        "configs/quickstart.yaml",
        "--set",
        "train.precision=fp32",
        "--set",
        "rollout.dtype=float32",
        "--set",
        "rollout.engine=grpolab_process",
        "--set",
        "rollout.max_staleness=1",
        "--set",
        "algorithm.is_mode=token_truncate",
    ],
    "vllm": ["configs/quickstart.yaml", "--set", "train.precision=fp32", "--set", "rollout.engine=vllm"],
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def fingerprint(run: Path) -> dict:
    """sha256 of samples, of the non-volatile metrics (and the metrics themselves, to name a difference), weights."""
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    stable = [{k: v for k, v in m.items() if not k.startswith(VOLATILE)} for m in metrics]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line.strip()]
    for s in samples:
        s.pop("time", None)
    ckpts = sorted((run / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    weights = b"".join(p.read_bytes() for p in sorted(ckpts[-1].rglob("*.safetensors"))) if ckpts else b""
    return {
        "samples": sha(json.dumps(samples, sort_keys=True).encode()),
        "weights": sha(weights),
        "metrics": stable,
    }


def run_case(name: str, args: list[str], work: Path) -> dict | None:
    if name == "vllm" and not (ROOT / ".venv-vllm" / ".vllm-installed").exists():
        return None
    cmd = [sys.executable, "-c", "from grpolab.cli import main; main()", "train", *args, *COMMON]
    cmd += ["--set", f"run.name={name}", "--set", f"run.output_dir={work}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ))
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    return fingerprint(work / name)


def compare(before: dict, after: dict) -> list[str]:
    """Lines naming every difference; a metric only in `after` is listed as added."""
    lines = []
    for case, b in before.items():
        a = after.get(case)
        if b is None or a is None or "error" in b or "error" in a:
            lines.append(f"{case}: not compared ({'error' if a and 'error' in a else 'missing'})")
            continue
        for key in ("samples", "weights"):
            if a[key] != b[key]:
                lines.append(f"{case}: {key} differ ({b[key]} -> {a[key]})")
        for step, (mb, ma) in enumerate(zip(b["metrics"], a["metrics"])):
            for k, v in mb.items():
                if ma.get(k) != v:
                    lines.append(f"{case} step {step}: {k} {v} -> {ma.get(k)}")
            added = sorted(set(ma) - set(mb))
            if added and step == 0:
                lines.append(f"{case}: metrics added {added}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", default=None, help="an earlier --out to compare with")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ",".join(CASES))
    a = ap.parse_args()
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.cases.split(","):
            result[name] = run_case(name, CASES[name], Path(tmp))
            status = "skipped (no .venv-vllm)" if result[name] is None else result[name].get("error", "ok")[:300]
            print(name, status if status != "ok" else {k: result[name][k] for k in ("samples", "weights")}, flush=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    if a.compare:
        diffs = compare(json.loads(Path(a.compare).read_text()), result)
        print("\n".join(diffs) if diffs else "identical: samples, weights and every earlier metric")


if __name__ == "__main__":
    main()
