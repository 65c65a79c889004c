"""run.report_to: TensorBoard, W&B (offline) and MLflow get what metrics.jsonl gets, read back with each library's
own reader; a resume continues the same tracker runs without duplicate steps; a tracker that fails never stops
training; the completions table is reproducible and shows the zero-variance groups."""

from __future__ import annotations

import errno
import json
import logging
import math
import shutil
import struct
from pathlib import Path

import earnable
import numpy as np
import pytest
import torch

from grpolab.config import TRACKERS, from_dict
from grpolab.errors import ConfigError
from grpolab.models import checkpoint as ckpt
from grpolab.runs import resume_run, start_run
from grpolab.training import trackers
from grpolab.training.metrics import completion_table, read_jsonl
from grpolab.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")
VOLATILE = ("time/", "throughput/", "memory/")  # measured, not computed: a redone step measures them anew


def config(model_dir: str, out: Path, name: str, report_to: list[str], steps: int = 4, **run) -> dict:
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 50, "num_test": 20}},
        "reward": earnable.reward_config(),
        "rollout": earnable.rollout_config(group_size=4),
        "algorithm": {"preset": "grpo", "beta": 0.0, "entropy_coef": 0.0},
        "train": {
            "steps": steps,
            "prompts_per_step": 2,
            "micro_batch_size": 8,
            "lr": 5e-3,
            "seed": 0,
            "samples_per_step": 1,
            "save_every": 2,
            "save_every_minutes": 0,
            "keep_last": 5,
        },
        "eval": {"every_steps": 2, "num_problems": 2, "max_new_tokens": 2},
        "run": {"output_dir": str(out), "name": name, "report_to": report_to, **run},
    }


# ----------------------------------------------------------------------------------------------- readers


def tensorboard_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series as TensorBoard shows it (its EventAccumulator, which applies purge_step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def mlflow_client(run: Path):
    from mlflow import MlflowClient

    entry = json.loads((run / trackers.LEDGER).read_text())["mlflow"]
    return MlflowClient(tracking_uri=entry["tracking_uri"]), entry["run_id"]


def wandb_history(run: Path) -> tuple[list[dict], set[str]]:
    """History rows ({"_step": N, key: value}) of every offline run file under RUN/wandb, oldest first, and their run ids.

    wandb 0.31 has no Python reader of its .wandb files (its datastore moved into the Go core), so this reads the
    file as W&B writes it: a 7-byte header (':W&B', magic 0xBEE1, version 0), then LevelDB log framing -- 32 KiB
    blocks of records, each a 7-byte header (crc32, little-endian length, type 1 full / 2 first / 3 middle / 4 last)
    and its payload -- whose reassembled payloads are wandb_internal_pb2.Record protobufs, parsed with W&B's own
    protobuf classes."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows, ids = [], set()
    for path in sorted((run / "wandb").glob("offline-run-*/run-*.wandb")):
        data = path.read_bytes()
        assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1
        pos, pending = 7, b""
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
                pos += 32768 - pos % 32768
                continue
            length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
            payload, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
            if kind == 0:
                break
            pending = payload if kind in (1, 2) else pending + payload
            if kind in (1, 4):
                record = pb.Record()
                record.ParseFromString(pending)
                if record.WhichOneof("record_type") == "history":
                    rows.append(
                        {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
                    )
                elif record.WhichOneof("record_type") == "run":
                    ids.add(record.run.run_id)
    return rows, ids


def series_by_step(points: list[tuple[int, float]]) -> dict[int, float]:
    steps = [s for s, _ in points]
    assert len(steps) == len(set(steps)), f"duplicate steps: {steps}"
    return dict(points)


def assert_same(
    name: str, got: dict[str, dict[int, float]], want: list[dict], first: list[dict], replaced: bool
) -> None:
    """`got` (tracker: key -> step -> value) holds every number of metrics.jsonl (`want`) at its step; a tracker that
    cannot replace redone steps holds their first measurements (`first`: metrics.jsonl before the resume)."""
    before = {r["step"]: r for r in first}
    for row in want:
        for key, value in row.items():
            if key == "step" or value is None:
                continue
            expect = value
            if key.startswith(VOLATILE) and not replaced and row["step"] in before:
                expect = before[row["step"]][key]
            assert math.isclose(got[key][row["step"]], expect, rel_tol=1e-6, abs_tol=1e-9), (name, key, row["step"])
        assert set(row) - {"step"} <= set(got), (name, sorted(set(row) - set(got)))


# ----------------------------------------------------------------------------------------------- tests


def test_a_tracker_that_is_not_installed_is_one_error_before_the_model_loads(tmp_path, monkeypatch):
    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda m: None if m == "wandb" else real(m))
    cfg = from_dict(config(str(tmp_path / "no-such-model"), tmp_path, "x", ["tensorboard", "wandb"]))
    with pytest.raises(
        ConfigError,
        match=r"^run\.report_to: wandb needs wandb, which is not installed: "
        r"pip install 'grpolab\[wandb\]'$",
    ):
        Trainer(cfg, tmp_path / "x")  # the model directory does not exist: the tracker is checked first


@pytest.mark.slow
def test_every_tracker_holds_metrics_jsonl_and_a_resume_adds_no_duplicate_step(tiny_model_dir, tmp_path):
    """4 steps (checkpoints at 2 and 4), then step-4 is lost as in a kill -9 while it was written: the resume redoes
    steps 3 and 4. Each tracker then holds steps 1-4 once each, with metrics.jsonl's values."""
    cfg = from_dict(config(tiny_model_dir, tmp_path, "all", ["tensorboard", "wandb", "mlflow"], table_every_steps=2))
    trainer, _ = start_run(cfg)
    trainer.fit()
    run = tmp_path / "all"
    first = read_jsonl(run / "metrics.jsonl")
    shutil.rmtree(run / "checkpoints" / "step-4")
    resumed, path = resume_run(run, [], allow_changes=False)
    assert path.name == "step-2"
    resumed.fit()
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and "eval/accuracy" in rows[1] and "reward/earn/mean" in rows[0]

    tb = {k: series_by_step(v) for k, v in tensorboard_scalars(run).items()}
    assert_same("tensorboard", tb, rows, first, replaced=True)

    client, run_id = mlflow_client(run)
    ml = {k: series_by_step([(m.step, m.value) for m in client.get_metric_history(run_id, k)]) for k in tb}
    assert_same("mlflow", ml, rows, first, replaced=False)
    params = client.get_run(run_id).data.params
    assert params["train.lr"] == "0.005" and params["run.report_to"] == '["tensorboard", "wandb", "mlflow"]'
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"manifest.json", "objective_card.json", "completions"} <= artifacts
    assert (
        json.loads(
            client.download_artifacts(run_id, "manifest.json", str(tmp_path))
            and (tmp_path / "manifest.json").read_text()
        )["config"]["train"]["lr"]
        == 0.005
    )
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == 1  # the same run continued

    history, ids = wandb_history(run)
    assert len(ids) == 1 and len(list((run / "wandb").glob("offline-run-*"))) == 2  # two sessions, one W&B run
    wb: dict[str, list[tuple[int, float]]] = {}
    for h in history:
        for k, v in h.items():
            if isinstance(v, (int, float)) and not k.startswith("_"):
                wb.setdefault(k, []).append((h["_step"], v))
    assert_same("wandb", {k: series_by_step(v) for k, v in wb.items()}, rows, first, replaced=False)

    # the completions tables of steps 2 and 4 (run.table_every_steps = 2), once each, in every tracker
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0})  # the server's reader: it also
    acc.Reload()  # purges text after a restart (the legacy accumulator purges scalars only)
    assert [e.step for e in acc.Tensors("completions/text_summary")] == [2, 4]
    assert [(h["_step"], h["completions/nrows"]) for h in history if h.get("completions/_type") == "table-file"] == [
        (2, 8),
        (4, 8),
    ]  # both groups of the step (fewer than run.table_groups = 4), G = 4 completions each
    tables = sorted(a.path for a in client.list_artifacts(run_id, "completions"))
    assert tables == ["completions/step-000002.json", "completions/step-000004.json"]
    table = json.loads(Path(client.download_artifacts(run_id, tables[1], str(tmp_path))).read_text())
    assert table["columns"][:6] == ["step", "group", "uid", "prompt", "completion", "reward"]
    assert {r[0] for r in table["data"]} == {4} and len(table["data"]) == 2 * 4


def test_a_tracker_that_fails_mid_run_is_turned_off_and_training_and_jsonl_go_on(
    tiny_model_dir, tmp_path, monkeypatch, caplog
):
    calls = []

    def full_disk(self, step, metrics):
        calls.append(step)
        if step == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, step, metrics)

    real = trackers.TensorBoardSink.log_metrics
    monkeypatch.setattr(trackers.TensorBoardSink, "log_metrics", full_disk)
    monkeypatch.setattr(trackers.WandbSink, "__init__", lambda self, run: (_ for _ in ()).throw(RuntimeError("boom")))
    cfg = config(tiny_model_dir, tmp_path, "fails", ["wandb", "tensorboard"], steps=3)
    cfg["eval"] = {"every_steps": 0}
    trainer, _ = start_run(from_dict(cfg))
    with caplog.at_level(logging.WARNING, logger="grpolab"):
        trainer.fit()
    run = tmp_path / "fails"
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]
    assert calls == [1, 2]  # turned off after its failure
    # TensorBoard stores scalars as float32: the JSONL value rounded to float32, exactly
    first = read_jsonl(run / "metrics.jsonl")[0]["reward/mean"]
    assert list(tensorboard_scalars(run)["reward/mean"]) == [(1, float(np.float32(first)))]
    warnings = [r.getMessage() for r in caplog.records if "run.report_to" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "wandb failed while starting (RuntimeError: boom)" in warnings[0]
    assert "tensorboard failed while logging step 2 (OSError: [Errno 28] No space left on device)" in warnings[1]
    assert ckpt.latest_checkpoint(run).name == "step-3"


class Recorder:
    def __init__(self, run):
        self.state, self.sent = {"id": "r"}, []

    def log_metrics(self, step, metrics):
        self.sent.append(step)

    def log_table(self, step, columns, rows):
        self.sent.append(("table", step))

    def close(self):
        pass


def test_resumed_fan_out_skips_steps_a_tracker_cannot_replace(tmp_path, monkeypatch):
    """Unit: W&B / MLflow kinds skip what the ledger says they hold; TensorBoard's kind sends it again."""
    assert tuple(trackers.KINDS) == TRACKERS  # every name run.report_to accepts has a sink
    monkeypatch.setitem(trackers.KINDS, "wandb", trackers.TrackerKind((), Recorder, False))
    monkeypatch.setitem(trackers.KINDS, "tensorboard", trackers.TrackerKind((), Recorder, True))
    cfg = from_dict({"run": {"report_to": ["wandb", "tensorboard"]}})
    t = trackers.Trackers.open(cfg, tmp_path, 0, {})
    for step in (1, 2, 3):
        t.log(step, {"a": 1.0})
    assert json.loads((tmp_path / trackers.LEDGER).read_text())["wandb"] == {"id": "r", "logged_through": 3}
    t = trackers.Trackers.open(cfg, tmp_path, 1, {})  # resumed from a checkpoint of step 1
    for step in (2, 3, 4):
        t.log_table(step, ["c"], [[step]])
        t.log(step, {"a": 1.0})
    assert t.sinks["wandb"].sent == [("table", 4), 4]
    assert t.sinks["tensorboard"].sent == [("table", 2), 2, ("table", 3), 3, ("table", 4), 4]


def test_the_completions_table_is_reproducible_and_shows_zero_variance_groups(tiny_model_dir):
    """A hand-built batch of 4 groups x 2 completions; groups 1 and 3 have zero reward variance."""
    from types import SimpleNamespace

    from grpolab.models.load import load_tokenizer
    from grpolab.tasks.base import Problem

    tok = load_tokenizer(tiny_model_dir)
    prompt = tok("What is 2+2?", return_tensors="pt").input_ids[0]
    n = 8
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    rollout = SimpleNamespace(
        group=torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]),
        texts=[f"answer {i}" for i in range(n)],
        prompt_ids=prompt.repeat(n, 1),
        prompt_mask=torch.ones(n, len(prompt), dtype=torch.long),
        completion_mask=torch.tensor([[1, 1, 1]] * 4 + [[1, 0, 0]] * 4),
        truncated=torch.tensor([True] + [False] * 7),
    )
    scores = SimpleNamespace(
        rewards=rewards,
        invalid=torch.zeros(n, dtype=torch.bool),
        components={"correct": rewards, "format": torch.full((n,), 0.1, dtype=torch.float64)},
    )
    batch = SimpleNamespace(
        rollout=rollout,
        scores=scores,
        advantages=torch.tensor([0.7, -0.7, 0, 0, -0.7, 0.7, 0, 0]),
        problems=[Problem(f"p{g}", "What is 2+2?", "4") for g in range(4)],
    )
    columns, rows = completion_table(batch, tok, 2, seed=0, step=5)
    assert columns == [
        "step",
        "group",
        "uid",
        "prompt",
        "completion",
        "reward",
        "reward/correct",
        "reward/format",
        "advantage",
        "length",
        "finish_reason",
        "zero_variance_group",
    ]
    assert (columns, rows) == completion_table(batch, tok, 2, seed=0, step=5)  # reproducible
    flat = [r for r in rows if r[-1]]
    assert len(rows) == 4 and len(flat) == 2 and {r[2] for r in flat} <= {"p1", "p3"}  # one zero-variance group
    assert {r[2] for r in rows if not r[-1]} <= {"p0", "p2"}
    for r in rows:
        i = int(r[4].split()[1])
        assert r[3] == "What is 2+2?" and r[5] == rewards[i].item() and r[7] == 0.1
        assert r[8] == pytest.approx(batch.advantages[i].item()) and r[9] == (3 if i < 4 else 1)
        assert r[10] == ("length" if i == 0 else "stop")
    everything = completion_table(batch, tok, 10, seed=0, step=5)[1]
    assert [r[2] for r in everything] == ["p0", "p0", "p1", "p1", "p2", "p2", "p3", "p3"]
