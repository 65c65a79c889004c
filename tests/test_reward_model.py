"""Reward models: the Bradley-Terry loss and its gradient, pair accuracy, `grpolab rm train` on a separable toy set,
batch-invariant scoring by the `model` reward, and the rule that a reward model never sees a held-out problem."""

from __future__ import annotations

import json
import math

import pytest
import torch

from grpolab.config import from_dict
from grpolab.errors import ConfigError, DataError
from grpolab.reward_model import bradley_terry_loss, load_pairs_jsonl, pair_accuracy_interval
from grpolab.reward_model.pairs import (
    check_disjoint,
    pairs_from_verdicts,
    split_by_prompt,
    task_pairs,
    training_problems,
)
from grpolab.reward_model.train import RMSettings, build_pairs, train_reward_model
from grpolab.rewards import RewardSet
from grpolab.rewards.model import ModelReward, encode, normalize_scores, resolve_rm_path, rm_text
from grpolab.tasks import make_task, render_prompt


def test_bradley_terry_loss_and_gradient_match_hand_values():
    chosen = torch.tensor([2.0, 0.0], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([1.0, 1.0], dtype=torch.float64, requires_grad=True)
    loss = bradley_terry_loss(chosen, rejected)
    # L = (softplus(-1) + softplus(1)) / 2 = (log(1 + e^-1) + log(1 + e)) / 2
    assert loss.item() == pytest.approx((math.log1p(math.exp(-1)) + math.log1p(math.e)) / 2, abs=1e-12)
    assert loss.item() == pytest.approx(0.8132616875182228, abs=1e-12)
    loss.backward()
    s = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    # dL/dr_c = -sigmoid(r_r - r_c) / N, dL/dr_r = +sigmoid(r_r - r_c) / N
    assert chosen.grad.tolist() == pytest.approx([-s(-1) / 2, -s(1) / 2], abs=1e-12)
    assert rejected.grad.tolist() == pytest.approx([s(-1) / 2, s(1) / 2], abs=1e-12)
    shifted = bradley_terry_loss(chosen.detach() + 5.0, rejected.detach() + 5.0)  # only the margin matters
    assert shifted.item() == pytest.approx(loss.item(), abs=1e-12)
    big = bradley_terry_loss(torch.tensor([0.0]), torch.tensor([200.0]))  # softplus: no overflow
    assert big.item() == pytest.approx(200.0)


def test_pair_accuracy_interval_resamples_prompts():
    out = pair_accuracy_interval([1, 1, 0, 0.5], ["a", "a", "b", "c"], n_boot=4000)
    assert out["accuracy"] == pytest.approx(0.625) and out["n"] == 4
    assert 0.0 <= out["ci_low"] < 0.625 < out["ci_high"] <= 1.0
    # clusters: prompt a (2 of 2 right) is drawn whole, so the bootstrap never sees accuracy exactly 0.75 = 3/4 from
    # three single draws of a's pairs; every resampled accuracy is a ratio of whole prompts' sums
    one = pair_accuracy_interval([1, 1, 1, 1], ["a", "a", "b", "b"])
    assert (one["ci_low"], one["ci_high"]) == (1.0, 1.0)


def test_pairs_from_verdicts_prefers_right_answers_and_skips_duplicates():
    pairs = pairs_from_verdicts("p", "u", ["x", "y", "x", "z", "y"], [True, False, True, False, False], max_pairs=4)
    assert [(q.chosen, q.rejected) for q in pairs] == [("x", "y")]
    assert pairs_from_verdicts("p", "u", ["a", "b"], [True, True], 4) == []


def test_jsonl_pairs_errors_name_file_row_and_field(tmp_path):
    p = tmp_path / "pairs.jsonl"
    p.write_text(
        json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"})
        + "\n"
        + json.dumps({"prompt": "q", "chosen": "a"})
        + "\n"
    )
    with pytest.raises(DataError, match=r"pairs.jsonl: row 2: field 'rejected': expected a non-empty string"):
        load_pairs_jsonl(p)
    p.write_text("{not json\n")
    with pytest.raises(DataError, match=r"pairs.jsonl:1: malformed JSON"):
        load_pairs_jsonl(p)
    with pytest.raises(DataError, match="not found"):
        load_pairs_jsonl(tmp_path / "missing.jsonl")


def test_reward_model_never_sees_held_out_problems():
    options = {"max_operand": 20, "operators": "+-", "terms": 2, "seed": 0, "test_fraction": 0.3, "num_test": 300}
    task = make_task("arithmetic", **options)
    train_uids = {p.uid for p in task.problems("train")}
    held_out = task.problems("test")
    seen: list[str] = []

    def generate(problems):  # one right and one wrong answer per problem: every problem gives a pair
        seen.extend(p.uid for p in problems)
        return [[f"\\boxed{{{p.answer}}}", "\\boxed{999}"] for p in problems]

    s = RMSettings(task="arithmetic", task_options=options, num_problems=10_000, samples_per_problem=2)
    pairs, summary = build_pairs(s, torch.device("cpu"), generate)
    assert seen and set(seen) <= train_uids and not set(seen) & {p.uid for p in held_out}
    assert summary["pairs"] == len(pairs) == len(train_uids) and summary["held_out_checked"] == len(held_out)
    held_prompts = {render_prompt(p) for p in held_out}
    assert not any(q.prompt in held_prompts for q in pairs)
    leaked = task_pairs(held_out[:1], generate, 1)[0]  # pairs built on a held-out problem are refused
    with pytest.raises(DataError, match="held-out problem"):
        check_disjoint(pairs[:3] + leaked, held_out)
    assert [p.uid for p in training_problems(task, 5, 0)] == [p.uid for p in training_problems(task, 5, 0)]
    train, val = split_by_prompt(pairs, 0.2, 0)
    assert not {q.uid for q in train} & {q.uid for q in val} and len(val) == round(0.2 * len(pairs))


def _tiny_rm(tiny_model_dir):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    return LlamaForSequenceClassification(config).eval(), tok


def test_scoring_is_identical_batched_and_one_by_one(tiny_model_dir, one_thread):
    model, tok = _tiny_rm(tiny_model_dir)
    prompts = ["What is 2 + 3?", "What is 17 - 9? Show your work in a long and winding way, please."] * 3
    completions = ["5", "The answer is \\boxed{8}." * 6, "", "x" * 300, "I think 5", "eight<|im_end|>"]
    options = {"batch_size": 8, "max_length": 48}
    batched = ModelReward(options, "cpu", model, tok).raw_scores(prompts, completions)
    alone = ModelReward({**options, "batch_size": 1}, "cpu", model, tok).raw_scores(prompts, completions)
    assert batched == pytest.approx(alone, abs=1e-5)
    assert len(set(round(x, 4) for x in batched)) > 3  # the scores differ: a constant would pass trivially
    ids, mask = encode(tok, [rm_text(tok, p, c) for p, c in zip(prompts, completions)], 48)
    assert ids.shape[1] == 48 and mask[:, -1].all()  # left-truncated to max_length, left-padded
    long_text = rm_text(tok, prompts[1], completions[3])
    assert tok(long_text, add_special_tokens=False)["input_ids"][-48:] == ids[3].tolist()  # the END is kept
    # the same completion in another batch (other neighbours, other padding) keeps its score
    again = ModelReward(options, "cpu", model, tok).raw_scores(
        prompts[3:4] + prompts[:1], completions[3:4] + completions[:1]
    )
    assert again == pytest.approx([batched[3], batched[0]], abs=1e-5)


def test_jsonl_pairs_without_uid_are_grouped_by_their_normalised_prompt(tmp_path):
    """Pairs of one prompt are not independent: without a uid they are split (and bootstrapped) as one prompt,
    whatever their case or spacing, so no held-out pair has a prompt seen in training."""
    p = tmp_path / "pairs.jsonl"
    rows = [
        {
            "prompt": f"What is {i} + {i}?" if k % 2 else f"  what IS {i} +  {i}?\n",
            "chosen": f"{2 * i}",
            "rejected": f"{2 * i + k + 1}",
        }
        for i in range(10)
        for k in range(3)
    ]
    rows.append({"prompt": "What is 0 + 0?", "chosen": "0", "rejected": "9", "uid": "mine"})  # a given uid is kept
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = load_pairs_jsonl(p)
    assert len({q.uid for q in pairs}) == 11 and pairs[-1].uid == "mine"
    assert len({q.uid for q in pairs[:3]}) == 1 and pairs[0].uid != pairs[3].uid
    train, val = split_by_prompt(pairs[:-1], 0.3, seed=0)
    assert len(val) == 9 and len(train) == 21  # 3 of 10 prompts, all 3 pairs of each
    seen = {" ".join(q.prompt.lower().split()) for q in train}
    assert not seen & {" ".join(q.prompt.lower().split()) for q in val}


def test_normalisation_skips_non_finite_scores():
    """One NaN or inf score makes only its own sample invalid; the others are z-scored over the finite ones."""
    nan, inf = math.nan, math.inf
    out = normalize_scores([1.0, nan, 3.0, inf], eps=0.0)  # finite ones: mean 2, population std 1
    assert out[0] == -1.0 and out[2] == 1.0 and math.isnan(out[1]) and out[3] == inf

    class Planted(ModelReward):
        def raw_scores(self, prompts, completions):
            return [1.0, nan, 3.0, -inf]

    scored = Planted({"normalize": True}, "cpu", model=object(), tokenizer=object())(
        ["a", "b", "c", "d"], make_task("arithmetic").problems("train")[:4]
    )
    assert [s.value for s in scored] == [pytest.approx(-1.0, abs=1e-5), None, pytest.approx(1.0, abs=1e-5), None]
    assert scored[1].error == "the reward model returned nan" and scored[3].error == "the reward model returned -inf"


def test_normalisation_is_a_per_batch_z_score(tiny_model_dir, one_thread):
    assert normalize_scores([1.0, 2.0, 3.0]) == pytest.approx([-1.2247, 0.0, 1.2247], abs=1e-4)
    model, tok = _tiny_rm(tiny_model_dir)
    problems = [make_task("arithmetic").problems("train")[i] for i in range(4)]
    completions = ["\\boxed{1}", "\\boxed{2} and more", "no", "\\boxed{4} " * 3]
    raw = ModelReward({"batch_size": 4}, "cpu", model, tok)(completions, problems)
    norm = ModelReward({"batch_size": 4, "normalize": True}, "cpu", model, tok)(completions, problems)
    assert [s.value for s in norm] == pytest.approx(normalize_scores([s.value for s in raw]), abs=1e-9)
    assert [s.extras["model/raw"] for s in norm] == pytest.approx([s.value for s in raw], abs=1e-9)


def test_model_reward_config_errors_name_the_field(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match=r"reward.model.path: expected a reward model"):
        RewardSet({"model": 1.0}, model={"path": ""})
    with pytest.raises(ConfigError, match=r"reward.model.path: .* is not a model directory"):
        RewardSet({"model": 1.0}, model={"path": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"reward.model.batch_size: expected an integer >= 1"):
        from_dict({"reward": {"model": {"batch_size": 0}}})
    with pytest.raises(ConfigError, match="'model' is a built-in reward"):
        RewardSet({"model": 1.0}, callables={"model": lambda c, p: 1.0}, model={"path": tiny_model_dir})


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_rm_train_reaches_full_pair_accuracy_on_a_separable_set(tiny_model_dir, tmp_path, one_thread, lora_rank):
    """Chosen answers end in "yes", rejected ones in "no": a reward model that learns anything separates them, on
    prompts it never trained on; the run directory is then a valid reward.model.path (LoRA: merged, a plain model)."""
    rows = [
        {"prompt": f"Question number {i}: is it good?", "chosen": f"Answer {i}: yes", "rejected": f"Answer {i}: no"}
        for i in range(40)
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = RMSettings(
        backbone=tiny_model_dir,
        pairs=str(path),
        epochs=3,
        batch_size=8,
        lr=3e-3 if not lora_rank else 1e-2,
        val_fraction=0.25,
        device="cpu",
        output_dir=str(tmp_path / "runs"),
        name="rm",
        lora_rank=lora_rank,
    )
    out = train_reward_model(s)
    result = out["result"]
    assert result["val_pairs"] == 10 and result["train_pairs"] == 30
    assert result["after"]["accuracy"] == 1.0 and result["after"]["ci_low"] == 1.0
    assert result["before"]["accuracy"] < 1.0  # the untrained head does not already separate them
    run = tmp_path / "runs" / "rm"
    assert resolve_rm_path(str(run)) == str(run / "model") and not (run / "model" / "adapter_config.json").exists()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["kind"] == "reward_model" and manifest["hashes"]["train_pairs"] != manifest["hashes"]["val_pairs"]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 3 * math.ceil(30 / 8) and metrics[-1]["rm/loss"] < metrics[0]["rm/loss"]
    reward = ModelReward({"path": str(run)}, "cpu")  # the `model` reward loads the run and ranks like training did
    val = [json.loads(line) for line in (run / "pairs" / "val.jsonl").read_text().splitlines()]
    chosen = reward.raw_scores([q["prompt"] for q in val], [q["chosen"] for q in val])
    rejected = reward.raw_scores([q["prompt"] for q in val], [q["rejected"] for q in val])
    assert all(c > r for c, r in zip(chosen, rejected))
