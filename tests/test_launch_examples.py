"""The launch examples for separate machines (examples/launch/: SLURM, Kubernetes, the serving copy of a model) say
what grpolab and vLLM accept, so they cannot rot silently.

The sbatch script runs here with stand-ins for srun, scontrol and curl that record each command; the Kubernetes
manifests are parsed. Each trainer command must parse as torchrun's (torch.distributed.run's own parser) and as
`grpolab train` (its options, then its --set fields through the config loader, which refuses an unknown field); each
server must carry every flag grpolab's own server start passes for the RL API (grpolab.rollout.servers
.serve_command) and VLLM_SERVER_DEV_MODE=1; rollout.servers must name every server, each by its own address.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpolab.rollout.servers import serve_command

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "examples" / "launch"
RL_FLAGS = ("--enable-scale-out", "--logprobs-mode", "--generation-config", "--weight-transfer-config")
"""The server flags the RL path needs (the rest of serve_command: where and what it serves)."""


def flag_values(argv: list[str]) -> dict[str, str | None]:
    """--flag value / --flag=value / --flag (None) of a command line."""
    out: dict[str, str | None] = {}
    for i, a in enumerate(argv):
        if not a.startswith("--"):
            continue
        if "=" in a:
            key, value = a.split("=", 1)
            out[key] = value
        else:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[a] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def check_server_flags(argv: list[str], env: dict[str, str]) -> dict[str, str | None]:
    """The server's flags hold every RL flag with grpolab's value, and its environment the RL API switch."""
    ours = flag_values(serve_command(Path("python"), Path("model"), 8000, "bfloat16", 4096, 0, "gloo"))
    got = flag_values(argv)
    for flag in RL_FLAGS:
        assert flag in got, f"{flag} missing from {argv}"
        if flag == "--weight-transfer-config":
            assert json.loads(got[flag]) == json.loads(ours[flag])
        else:
            assert got[flag] == ours[flag], flag
    assert env.get("VLLM_SERVER_DEV_MODE") == "1" and got.get("--host") == "0.0.0.0"
    return got


def check_trainer(argv: list[str], nnodes: int, head: str, servers: list[str]) -> None:
    """torchrun's arguments, then `grpolab train`'s options and config fields."""
    import typer
    from torch.distributed.run import get_args_parser

    import grpolab
    import grpolab.cli.train  # noqa: F401  (registers the train command)
    from grpolab.cli.app import app

    run = get_args_parser().parse_args(argv)
    assert run.nnodes == str(nnodes) and run.rdzv_backend == "c10d" and run.rdzv_endpoint == f"{head}:29500"
    assert run.module and run.training_script == "grpolab" and run.training_script_args[0] == "train"
    train = typer.main.get_command(app).commands["train"]
    ctx = train.make_context("train", list(run.training_script_args[1:]), resilient_parsing=True)
    config = ROOT / ctx.params["config"]
    assert config.is_file(), config
    cfg = grpolab.load_config(config, list(ctx.params["set_"]))
    assert cfg.rollout.engine == "vllm_server" and sorted(cfg.rollout.servers) == sorted(set(servers))


@pytest.fixture
def stand_in_commands(tmp_path) -> Path:
    """A folder of srun, scontrol and curl stand-ins: srun records its argv (one JSON line each), scontrol expands a
    comma-separated node list, curl answers healthy once the srun that starts the URL's node has recorded itself (the
    servers start in the background; without this wait the script's closing kill could end one before it records)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "srun": f"#!{sys.executable}\nimport json, os, sys\n"
        "with open(os.environ['LAUNCH_LOG'], 'a') as f:\n    f.write(json.dumps(sys.argv[1:]) + '\\n')\n",
        "scontrol": "#!/usr/bin/env bash\necho \"$3\" | tr ',' '\\n'\n",
        "curl": '#!/usr/bin/env bash\nurl="${@: -1}"; host="${url#http://}"; host="${host%%:*}"\n'
        'grep -q -- "--nodelist=$host\\"" "$LAUNCH_LOG" 2> /dev/null\n',
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_slurm_script_launches_servers_and_trainers_grpolab_accepts(stand_in_commands, tmp_path):
    nodes = ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
    log = tmp_path / "srun.jsonl"
    env = {**os.environ, "PATH": f"{stand_in_commands}:{os.environ['PATH']}", "LAUNCH_LOG": str(log),
           "SLURM_JOB_NODELIST": ",".join(nodes), "SLURM_JOB_NUM_NODES": "4", "SLURM_JOB_ID": "7",
           "MODEL_DIR": "/shared/model-serving", "RUNS": str(tmp_path / "runs")}  # fmt: skip
    out = subprocess.run(["bash", str(LAUNCH / "slurm_grpolab.sbatch")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    commands = [
        c[next(i for i, a in enumerate(c) if not a.startswith("--")) :] for c in calls
    ]  # srun's own options off
    servers = [c for c in commands if "serve" in c]
    trainers = [c for c in commands if c[0].endswith("torchrun")]
    assert len(servers) == 2 and len(trainers) == 1 and len(calls) == 3
    urls = []
    for call, command in zip([c for c in calls if "serve" in c], servers):
        assert command[:2] == ["env", "VLLM_SERVER_DEV_MODE=1"] and command[3:5] == ["serve", "/shared/model-serving"]
        got = check_server_flags(command[5:], {"VLLM_SERVER_DEV_MODE": "1"})
        node = flag_values(call)["--nodelist"]
        urls.append(f"http://{node}:{got['--port']}")
    assert sorted(urls) == [f"http://{n}:8000" for n in nodes[2:]]
    trainer_call = next(c for c in calls if any(a.endswith("torchrun") for a in c))
    assert flag_values(trainer_call)["--nodelist"] == "gpu-a,gpu-b"
    check_trainer(trainers[0][1:], nnodes=2, head="gpu-a", servers=urls)


def test_kubernetes_manifests_name_each_server_and_launch_grpolab(tmp_path):
    docs = {
        (d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all((LAUNCH / "k8s_grpolab.yaml").read_text())
    }
    sts, svc = docs[("StatefulSet", "vllm")], docs[("Service", "vllm")]
    pod = sts["spec"]["template"]
    assert svc["spec"]["clusterIP"] == "None" and sts["spec"]["serviceName"] == "vllm"
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (server,) = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in server["env"]}
    got = check_server_flags(server["command"] + server["args"], env)
    assert server["command"] == ["vllm", "serve"]
    port = int(got["--port"])
    assert server["ports"][0]["containerPort"] == port == svc["spec"]["ports"][0]["port"]
    urls = [f"http://vllm-{i}.vllm:{port}" for i in range(sts["spec"]["replicas"])]

    job, trainer_svc = docs[("Job", "grpolab-train")], docs[("Service", "grpolab-trainer")]
    spec, tpl = job["spec"], job["spec"]["template"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    assert tpl["spec"]["subdomain"] == "grpolab-trainer" and trainer_svc["spec"]["clusterIP"] == "None"
    assert trainer_svc["spec"]["selector"].items() <= tpl["metadata"]["labels"].items()
    (wait,), (trainer,) = tpl["spec"]["initContainers"], tpl["spec"]["containers"]
    assert wait["args"][1:] == urls  # the trainer starts once every server answers /health
    assert trainer["command"] == ["torchrun"]
    check_trainer(trainer["args"], nnodes=spec["completions"], head="grpolab-train-0.grpolab-trainer", servers=urls)
    claims = {d["metadata"]["name"] for (kind, _), d in docs.items() if kind == "PersistentVolumeClaim"}
    for p in (pod, tpl):
        assert {
            v["persistentVolumeClaim"]["claimName"] for v in p["spec"]["volumes"] if "persistentVolumeClaim" in v
        } <= claims


def test_serving_model_writes_an_untied_copy_vllm_can_load(tiny_model_dir, tmp_path):
    """examples/launch/serving_model.py: the config untied, both output matrices stored, the tokenizer beside them."""
    from safetensors.torch import load_file

    out = tmp_path / "serving"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(LAUNCH / "serving_model.py"), tiny_model_dir, str(out), "--dtype",
                           "float32"], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    tensors = load_file(out / "model.safetensors")
    assert (tensors["lm_head.weight"] == tensors["model.embed_tokens.weight"]).all()
    assert (out / "tokenizer.json").is_file() or (out / "tokenizer_config.json").is_file()
