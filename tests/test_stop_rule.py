"""Stop rules (grpolab/rollout/stop.py): `code_block` ends a completion at the closing fence of its first Python
block, which is exactly what the code reward reads, and the decode loop applies a rule without changing any other
row's tokens."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpolab.rewards.code import extract_code
from grpolab.rollout.decode import TextStop, decode_groups
from grpolab.rollout.stop import StopRule, python_block_closed, stop_rule

ANSWERS = [
    "Sure:\n```python\ndef f(x):\n    return x + 1\n```",
    "```\nx = 1\n```",
    "Text first.\n```bash\nls\n```\nthen\n```py\ny = 2\n  ```",
    "```python3\nimport math\n```",
]


@pytest.mark.parametrize("answer", ANSWERS)
def test_stopping_at_the_rule_never_changes_what_the_reward_reads(answer):
    """Every prefix at which the rule fires: the reward's program from the prefix is the program of the whole
    answer with anything appended after it (a second block, prose)."""
    fired = [i for i in range(1, len(answer) + 1) if python_block_closed(answer[:i])]
    assert fired and fired[0] > answer.rindex("\n")  # it fires on the closing fence line, not before
    first = answer[: fired[0]]
    tail = "\nAnd a second one:\n```python\ndef f(x):\n    return 0\n```\nDone."
    assert extract_code(first) == extract_code(answer) == extract_code(answer + tail)


@pytest.mark.parametrize(
    "text",
    ["```python\ndef f(): pass\n", "```bash\nls\n```\n", "no code at all", "```javascript\nx\n```\n```python\nok\n"],
)
def test_the_rule_does_not_fire_before_a_python_block_is_closed(text):
    assert not python_block_closed(text)


def test_the_registry_names_its_rules():
    assert stop_rule("none") is None and stop_rule(StopRule.CODE_BLOCK)[1] == "`"
    with pytest.raises(ValueError, match=r"rollout.stop_rule: expected one of \['none', 'code_block'\], got 'eos'"):
        stop_rule("eos")


def tiny(vocab: int = 40) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def test_the_decode_loop_ends_rows_where_the_rule_says_and_nothing_else_changes():
    """A rule on a 40-token toy vocabulary ('a' = token 7 is the only trigger; the rule: two 'a's written). Rows it
    ends stop right after their second 7, are not truncated, and every token before is the one the run without the
    rule sampled; rows it does not end are identical to that run."""
    model = tiny()
    ids = torch.randint(1, 40, (3, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    decode = lambda toks: "".join("a" if t == 7 else "b" for t in toks)  # noqa: E731
    check = TextStop(lambda text: text.count("a") >= 2, torch.tensor([7]), decode)
    runs = [
        decode_groups(
            model,
            ids,
            mask,
            4,
            30,
            1.5,
            [],
            0,
            generators=[torch.Generator().manual_seed(s) for s in range(3)],
            stop_check=c,
        )
        for c in (None, check)
    ]
    plain, ruled = runs
    ended = 0
    for row in range(12):
        toks = plain.tokens[row].tolist()
        sevens = [i for i, t in enumerate(toks) if t == 7]
        if len(sevens) >= 2:
            end = sevens[1] + 1
            ended += 1
            assert int(ruled.mask[row].sum()) == end and not ruled.truncated[row]
            assert ruled.tokens[row, :end].tolist() == toks[:end]
            assert torch.equal(ruled.logprobs[row, :end], plain.logprobs[row, :end])
        else:
            assert ruled.tokens[row, : len(toks)].tolist() == toks and bool(ruled.truncated[row])
    assert 0 < ended < 12  # the rule ended some rows and not others (the test can tell)


def test_the_engine_finds_the_trigger_tokens_and_refuses_the_hf_decoder(tiny_model_dir):
    from grpolab.models.load import load_causal_lm, load_tokenizer
    from grpolab.rollout.base import SamplingParams
    from grpolab.rollout.grpolab_engine import GrpolabEngine

    tok = load_tokenizer(tiny_model_dir)
    engine = GrpolabEngine(load_causal_lm(tiny_model_dir, "float32"), tok, torch.float32)
    text_stop = engine.text_stop("code_block")
    fence = tok.encode("```", add_special_tokens=False)
    assert all(t in text_stop.triggers.tolist() for t in fence)
    assert tok.encode(" hello", add_special_tokens=False)[0] not in text_stop.triggers.tolist()
    assert engine.text_stop("none") is None
    hf = GrpolabEngine(engine.model, tok, torch.float32, decoder="hf")
    with pytest.raises(ValueError, match="stop_rule 'code_block' needs rollout.decoder: grpolab"):
        hf.generate([[1, 2]], SamplingParams(group_size=1, max_new_tokens=2, stop_rule="code_block"))


def test_auto_stops_at_the_code_block_exactly_when_a_code_reward_reads_it():
    from grpolab.card import objective_card
    from grpolab.card import stop_rule as resolved
    from grpolab.config import from_dict

    code = from_dict({"task": {"name": "pyfunc"}, "reward": {"weights": {"all_pass": 1.0}}})
    assert resolved(code) == "code_block" and objective_card(code)["choices"]["stop_rule"] == "code_block"
    assert resolved(from_dict({"reward": {"weights": {"correct": 1.0}}})) == "none"
    off = from_dict(
        {"task": {"name": "pyfunc"}, "reward": {"weights": {"pass_fraction": 1.0}}, "rollout": {"stop_rule": "none"}}
    )
    assert resolved(off) == "none"


@pytest.mark.parametrize("setting", ["auto", "none", "code_block"])
@pytest.mark.parametrize("reads_first_block", [True, False])
def test_resolving_the_setting_changes_only_auto(setting, reads_first_block):
    """The rollout's resolution: auto follows the reward (code_block iff it reads only the first code block);
    an explicit setting is kept whatever the reward; every result is a registered rule."""
    from grpolab.rollout.stop import resolve_stop_rule

    got = resolve_stop_rule(setting, reads_first_block)
    expected = setting if setting != "auto" else ("code_block" if reads_first_block else "none")
    assert got == expected and type(got) is str
    stop_rule(got)  # registered: raises otherwise


def test_a_logged_code_reward_still_reads_the_first_block():
    """A code reward weighted 0 (logged, not trained on) is still computed on the first code block, so auto stops
    there too -- the rewards' side of the resolution (grpolab.rewards.card.stop_rule)."""
    from grpolab.config import from_dict
    from grpolab.rewards import stop_rule as run_stop_rule

    logged = from_dict({"task": {"name": "pyfunc"}, "reward": {"weights": {"all_pass": 1.0, "pass_fraction": 0.0}}})
    assert run_stop_rule(logged) == "code_block"
    only_logged = from_dict({"reward": {"weights": {"correct": 1.0, "all_pass": 0.0}}})
    assert run_stop_rule(only_logged) == "code_block"
    assert run_stop_rule(from_dict({"reward": {"weights": {"correct": 1.0, "format": 0.1}}})) == "none"
