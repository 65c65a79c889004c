"""Held-out evaluation: item metrics, batching, summaries, overlap refusal, end-to-end eval, compare."""

from __future__ import annotations

import doctest
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from grpolab.errors import GrpolabError
from grpolab.evaluation import heldout as evaluate
from grpolab.evaluation import overlap
from grpolab.evaluation.heldout import Completion, generate_all, pass_ks, run_eval, score_item, summarise
from grpolab.manifest import data_hash, problem_hashes
from grpolab.report.compare import compare_entries, load_entries, seed_groups
from grpolab.rollout.base import Rollout, SamplingParams
from grpolab.tasks import make_task
from grpolab.tasks.base import Problem

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_gsm8k = pytest.mark.skipif(not (DATA / "gsm8k" / "test.jsonl").is_file(), reason=f"no GSM8K at {DATA}")


class StubEngine:
    """Returns fixed texts: texts_for(prompt_index, sample_index) -> str; records the prompts per call."""

    def __init__(self, texts_for):
        self.texts_for, self.calls, self.seen = texts_for, [], 0

    def generate(self, prompts, params: SamplingParams) -> Rollout:
        g = 1 if params.greedy else params.group_size
        self.calls.append(len(prompts))
        texts = [self.texts_for(self.seen + i, j) for i in range(len(prompts)) for j in range(g)]
        self.seen += len(prompts)
        n = len(texts)
        lengths = torch.tensor([len(t.split()) + 1 for t in texts])
        mask = (torch.arange(16)[None, :] < lengths[:, None]).long()
        z = torch.zeros((n, 1), dtype=torch.long)
        return Rollout(
            z,
            z,
            torch.zeros((n, 16), dtype=torch.long),
            mask,
            torch.zeros((n, 16)),
            torch.tensor(["TRUNC" in t for t in texts]),
            torch.arange(len(prompts)).repeat_interleave(g),
            texts,
        )

    def sync_weights(self, policy):
        pass


class StubTokenizer:
    chat_template = "stub"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return messages[0]["content"]

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1, 2, 3]}


def problems(n: int, slice_of=lambda i: "all") -> list[Problem]:
    return [Problem(f"t/{i}", f"What is {i} + 1?", str(i + 1), slice_of(i)) for i in range(n)]


def test_docstrings():
    for mod in (evaluate, overlap):
        assert doctest.testmod(mod).failed == 0


def test_generate_all_batches_prompts():
    eng = StubEngine(lambda i, j: f"answer {i}-{j}")
    out = generate_all(eng, StubTokenizer(), problems(7), SamplingParams(group_size=1, greedy=True), batch_size=3)
    assert eng.calls == [3, 3, 1] and [c[0].text for c in out] == [f"answer {i}-0" for i in range(7)]
    eng = StubEngine(lambda i, j: f"answer {i}-{j}")
    out = generate_all(eng, StubTokenizer(), problems(5), SamplingParams(group_size=3), batch_size=7)
    assert eng.calls == [2, 2, 1]  # 7 // 3 = 2 prompts (6 sequences) per call
    assert [c.text for c in out[4]] == ["answer 4-0", "answer 4-1", "answer 4-2"]


def test_score_item_pass_maj_mean_by_hand():
    p = Problem("t/0", "q", "5")
    samples = [Completion(t, 3, False) for t in ("so 5", r"\boxed{5.0}", "it is 7", "no idea")]
    item = score_item(p, Completion(r"\boxed{5}", 4, False), samples, task="gsm8k")
    s = item["scores"]
    assert s["accuracy"] == 1.0 and s["strict"] == 1.0 and s["flexible"] == 1.0
    # n = 4 samples, c = 2 correct: pass@1 = 2/4, pass@2 = 1 - C(2,2)/C(4,2) = 5/6, pass@4 = 1
    assert s["pass@1"] == pytest.approx(0.5) and s["pass@2"] == pytest.approx(5 / 6) and s["pass@4"] == 1.0
    assert s["maj@4"] == 1.0 and s["mean@4"] == 0.5
    item = score_item(p, Completion("5 apples", 2, True), [Completion(t, 2, False) for t in ("7", "7", "5")], "gsm8k")
    s = item["scores"]  # greedy right by last number but not in the requested \boxed format
    assert (s["accuracy"], s["strict"], s["flexible"]) == (1.0, 0.0, 1.0)
    assert s["maj@3"] == 0.0 and s["pass@1"] == pytest.approx(1 / 3) and s["pass@2"] == pytest.approx(2 / 3)
    assert (
        pass_ks(3) == [1, 2, 3] and "strict" not in score_item(p, Completion("5", 1, False), [], "arithmetic")["scores"]
    )


def test_summarise_interval_covers_mean_and_slices():
    items = [
        {
            "uid": f"u{i}",
            "slice": "a" if i < 40 else "b",
            "scores": {"accuracy": float(i % 2)},
            "length": i % 5,
            "truncated": i % 10 == 0,
        }
        for i in range(60)
    ]
    r = summarise(items, elapsed=2.0)
    assert r.accuracy == 0.5 and r.ci_low < 0.5 < r.ci_high and r.ci_high - r.ci_low < 0.4
    assert r.per_slice["a"]["n"] == 40 and r.per_slice["b"]["n"] == 20
    assert r.per_slice["a"]["accuracy"] == 0.5 and r.truncated_frac == pytest.approx(0.1)
    assert r.len_mean == 2.0 and r.len_max == 4 and r.problems_per_s == 30.0


def test_math500_subject_slices():
    p = Problem("math500/test/precalculus/807.json", "q", "3", "level=2")
    assert evaluate.slice_labels(p) == ["level=2", "subject=precalculus"]


def test_math500_subject_slices_pair():
    """A MATH-500 item's ``slice`` is its level; ``subject=...`` is only in ``slices``. Selecting a slice's items by
    ``slice`` found none for a subject, so subject slices were never paired (the report fell back to an unpaired
    difference); in_slice / paired_diffs(slice_=...) select by ``slices``."""

    def items(correct):
        return [
            {
                "uid": f"math500/test/{'algebra' if i < 30 else 'geometry'}/{i}.json",
                "slice": f"level={1 + i % 5}",
                "slices": [f"level={1 + i % 5}", "subject=algebra" if i < 30 else "subject=geometry"],
                "scores": {"accuracy": float(c)},
            }
            for i, c in enumerate(correct)
        ]

    base, trained = items([i % 3 == 0 for i in range(40)]), items([i % 3 == 0 or i < 6 for i in range(40)])
    assert evaluate.in_slice(base[0], "subject=algebra") and not evaluate.in_slice(base[0], "subject=geometry")
    algebra = evaluate.paired_diffs(base, trained, slice_="subject=algebra")["accuracy"]
    assert algebra["n"] == 30 and algebra["mean"] == pytest.approx(4 / 30)  # problems 1, 2, 4, 5 newly solved
    assert evaluate.paired_diffs(base, trained, slice_="subject=geometry")["accuracy"]["degenerate"] == "all equal"
    assert evaluate.paired_diffs(base, trained, slice_="level=1")["accuracy"]["n"] == 8


def test_paired_diffs_match_uids():
    a = [{"uid": f"u{i}", "scores": {"accuracy": 0.0}} for i in range(50)]
    b = [{"uid": f"u{i}", "scores": {"accuracy": 1.0 if i < 10 else 0.0}} for i in reversed(range(50))]
    d = evaluate.paired_diffs(a, b)["accuracy"]
    assert d["mean"] == pytest.approx(0.2) and d["n"] == 50 and d["ci_low"] < 0.2 < d["ci_high"]


# ------------------------------------------------------------------------------------------- overlap


def _fake_run(tmp: Path, model_dir: str, train: list[Problem], config: dict | None = None) -> Path:
    """A run directory with a manifest and one checkpoint holding the tiny model."""
    run = tmp / "run"
    ckpt = run / "checkpoints" / "step-1"
    shutil.copytree(model_dir, ckpt)
    (ckpt / "trainer_state.pt").write_bytes(b"")
    manifest = {"train_problem_hashes": problem_hashes(train), "config": config or {}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_overlap_detection(tmp_path):
    train = problems(20)
    run = tmp_path / "r"
    (run / "checkpoints" / "step-3").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"train_problem_hashes": problem_hashes(train)}))
    test = [Problem("x/1", "  WHAT is 3 +   1? ", "4"), Problem("x/2", "What is 100 + 1?", "101")]
    assert overlap.overlapping(test, problem_hashes(train)) == [test[0]]  # case and spacing do not hide a copy
    for loc in (run, run / "checkpoints" / "step-3"):
        with pytest.raises(GrpolabError, match=r"1 of 2 evaluation problems overlap.*x/1"):
            overlap.check_held_out(str(loc), str(loc), test)
    ok = overlap.check_held_out(str(run), None, test[1:])
    assert ok["checked"] and ok["train_problems"] == 20 and ok["overlap"] == 0
    assert not overlap.check_held_out("some/hub-id", None, test)["checked"]


def test_run_eval_refuses_training_problems(tiny_model_dir, tmp_path):
    task = make_task("arithmetic", num_train=30, num_test=4)
    run = _fake_run(tmp_path, tiny_model_dir, task.problems("train"))
    opts = {"num_train": 30, "num_test": 4}
    with pytest.raises(GrpolabError, match=r"\d+ of 4 evaluation problems overlap.*arithmetic/"):
        run_eval([str(run)], "arithmetic", {**opts, "num_train": 4}, "train", 4, 4, 4, "float32")
    res = run_eval([str(run)], "arithmetic", opts, "test", 0, 4, 4, "float32")
    assert res["models"][0]["held_out"]["checked"] and res["data_hash"] == data_hash(task.problems("test"))


# ------------------------------------------------------------------------------------------- end to end


@needs_gsm8k
def test_eval_tiny_model_on_gsm8k(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from grpolab.cli import app

    out = tmp_path / "eval.json"
    args = [
        "eval",
        tiny_model_dir,
        tiny_model_dir,
        "--task",
        "gsm8k",
        "--task-option",
        f"path={DATA / 'gsm8k'}",
        "--split",
        "test",
        "--limit",
        "3",
        "--max-new-tokens",
        "6",
        "--batch-size",
        "4",
        "--samples",
        "2",
        "--temperature",
        "1.0",
        "--dtype",
        "float32",
        "--out",
        str(out),
    ]
    r = CliRunner().invoke(app, args, catch_exceptions=False)
    assert r.exit_code == 0 and "wrote" in r.output
    res = json.loads(out.read_text())
    gold = make_task("gsm8k", path=str(DATA / "gsm8k")).problems("test")[:3]
    assert res["n"] == 3 and res["data_hash"] == data_hash(gold)
    first, second = res["models"]
    assert set(first["metrics"]) >= {"accuracy", "strict", "flexible", "pass@1", "pass@2", "maj@2", "mean@2"}
    assert [it["gold"] for it in first["items"]] == [p.answer for p in gold]
    assert all(1 <= it["length"] <= 6 and len(it["samples"]) == 2 for it in first["items"])
    assert [it["completion"] for it in first["items"]] == [it["completion"] for it in second["items"]]  # greedy
    assert second["diff_vs_first"] == {
        "mean": 0.0,
        "ci_low": 0.0,
        "ci_high": 0.0,
        "method": "t over problems",
        "degenerate": "all equal",
    }  # the same model twice: no evidence of anything
    assert not first["held_out"]["checked"]
    entries = load_entries([out])
    assert len(entries) == 1  # the same model twice on the same set is one row
    cmp = CliRunner().invoke(app, ["compare", str(out)], catch_exceptions=False)
    assert cmp.exit_code == 0 and "set" in cmp.output


# ------------------------------------------------------------------------------------------- compare


def _eval_json(path: Path, rows: list[tuple[str, str, list[float]]], h: str = "H") -> Path:
    models = []
    for name, model_path, acc in rows:
        items = [{"uid": f"u{i}", "scores": {"accuracy": a}} for i, a in enumerate(acc)]
        models.append(
            {
                "model": name,
                "path": model_path,
                "method": "greedy",
                "n": len(acc),
                "len_mean": 1.0,
                "truncated_frac": 0.0,
                "items": items,
                "metrics": {
                    "accuracy": summarise(
                        [{**it, "slice": "all", "length": 1, "truncated": False} for it in items], 1
                    ).metrics["accuracy"]
                },
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"task": "t", "split": "test", "data_hash": h, "decoding": {"samples": 0}, "models": models})
    )
    return path


def test_compare_seed_groups(tmp_path):
    base_cfg = {"config": {"train": {"seed": 0, "lr": 1e-5}, "task": {"name": "t"}}, "train_problem_hashes": []}
    accs = {"s0": [1, 1, 0, 0], "s1": [1, 1, 1, 0], "s2": [1, 0, 0, 0], "lr": [1, 1, 1, 1]}
    runs = []
    for i, (name, acc) in enumerate(accs.items()):
        m = json.loads(json.dumps(base_cfg))
        m["config"]["train"]["seed"] = i
        if name == "lr":
            m["config"]["train"]["lr"] = 1e-4
        run = tmp_path / name
        run.mkdir()
        (run / "manifest.json").write_text(json.dumps(m))
        _eval_json(run / "eval" / "e.json", [("base", "/base", [0, 0, 0, 0]), (str(run), str(run), acc)])
        runs.append(run)
    entries = load_entries(runs)
    assert [e["label"] for e in entries] == ["base", "s0", "s1", "s2", "lr"]  # base deduplicated
    groups = seed_groups(entries)
    assert [[e["label"] for e in g] for g in groups] == [["s0", "s1", "s2"]]
    res = compare_entries(entries, baseline="")
    acc = res["seed_groups"][0]["metrics"]["accuracy"]
    assert acc["mean"] == pytest.approx(0.5) and acc["std"] == pytest.approx(np.std([0.5, 0.75, 0.25], ddof=1))
    assert (acc["min"], acc["max"]) == (0.25, 0.75) and res["seed_groups"][0]["seeds"] == [0, 1, 2]
    rows = {r["label"]: r for r in res["eval_sets"][0]["rows"]}
    assert res["eval_sets"][0]["reference"] == "base" and rows["lr"]["diff_vs_reference"]["accuracy"]["mean"] == 1.0
    assert compare_entries(entries, baseline="s1")["eval_sets"][0]["reference"] == "s1"


def test_compare_keeps_eval_sets_apart(tmp_path):
    a = _eval_json(tmp_path / "a.json", [("m1", "/m1", [1, 0])], h="A")
    b = _eval_json(tmp_path / "b.json", [("m2", "/m2", [1, 1])], h="B")
    res = compare_entries(load_entries([a, b]))
    assert [len(s["rows"]) for s in res["eval_sets"]] == [1, 1]
    with pytest.raises(GrpolabError, match="expected a run directory"):
        load_entries([tmp_path / "missing"])


def test_a_result_that_cannot_be_written_leaves_the_earlier_one_whole(tmp_path):
    """write_result writes a temporary file and renames it: a failure (here a value JSON cannot hold) leaves the
    result already at the path byte for byte, and no half-written file."""
    from grpolab.evaluation.result import write_result

    path = write_result(tmp_path / "eval" / "result.json", {"accuracy": 0.5})
    before = path.read_bytes()
    with pytest.raises(TypeError):
        write_result(path, {"accuracy": object()})
    assert path.read_bytes() == before and json.loads(before) == {"accuracy": 0.5}
    assert sorted(p.name for p in path.parent.iterdir()) == ["result.json"]
