"""vLLM as the rollout engine (grpolab/rollout/vllm_engine.py, vllm_worker.py; docs/vllm.md).

The engine tests run the real worker in vLLM's own environment (``make install-vllm``) and are skipped, with that
reason, where it is absent. The model is a tiny random Llama whose head size the CPU build's attention kernels
accept (32) and whose weights are drawn wide (initializer_range 0.5) so that greedy decoding has clear winners:
with the default 0.02 the next-token logits of a random model are within float noise of each other and the argmax
of two correct implementations may differ. The process-level tests (a worker dying, hanging, failing) use small
stand-in worker scripts and need no vLLM.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap

import pytest
import torch

from grpolab.algo.logprobs import token_logprobs
from grpolab.errors import GrpolabError
from grpolab.rollout.base import SamplingParams
from grpolab.rollout.grpolab_engine import GrpolabEngine
from grpolab.rollout.vllm_engine import VLLMEngine, default_vllm_python
from grpolab.rollout.workers.process import EngineDied, EngineProcess, EngineUnavailable

HAS_VLLM = default_vllm_python().is_file()
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM's environment is absent: `make install-vllm` creates it")

# Measured on this test's model (fp32, 2-vCPU AMD EPYC with AVX-512 and AVX512-BF16), 32 completions x 32 tokens x 5 seeds at T = 0.8:
# vLLM's sampled-token logprobs differ from a float64 teacher-forced forward of the same weights by at most 1.8e-4,
# and torch's own fp32 forward by at most 1.2e-4 (logits up to |23|: fp32 rounding of the log-normaliser, in
# another reduction order). 1e-3 is 5x the worst seen, and 100x below the smallest per-token difference between
# the two models of the sync test (0.10), so a skipped sync cannot pass.
LOGP_ATOL = 1e-3


def tiny_llama(tok, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        initializer_range=0.5,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    """The bundled chat tokenizer (conftest's tiny model directory holds it, pad = eos when missing)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def policy(tok):
    return tiny_llama(tok, seed=0)


@pytest.fixture(scope="module")
def engine(policy, tok):
    if not HAS_VLLM:
        pytest.skip("vLLM's environment is absent: `make install-vllm` creates it")
    e = VLLMEngine(policy, tok, torch.float32, max_model_len=512)
    yield e
    e.close()


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok.encode(t) for t in ("Hello there", "What is 2 + 2?", "Name a colour", "x")]


def reference_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """float64 teacher-forced log softmax(logits / T)(o_t) of `completion` after `prompt`."""
    ref = tiny_copy64(model)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = ref(ids).logits[0, len(prompt) - 1 : -1]
    return token_logprobs(logits, torch.tensor(completion), temperature)


_COPIES: dict[int, torch.nn.Module] = {}


def tiny_copy64(model):
    import copy

    key = id(model)
    if key not in _COPIES:
        _COPIES[key] = copy.deepcopy(model).double().eval()
    return _COPIES[key]


def rows(rollout) -> list[list[int]]:
    return [r[m.bool()].tolist() for r, m in zip(rollout.completion_ids, rollout.completion_mask)]


@needs_vllm
def test_greedy_tokens_equal_grpolab_decoder(engine, policy, tok, prompts):
    params = SamplingParams(greedy=True, max_new_tokens=12)
    ours = GrpolabEngine(policy, tok, torch.float32).generate(prompts, params)
    theirs = engine.generate(prompts, params)
    assert rows(theirs) == rows(ours)
    assert theirs.truncated.tolist() == ours.truncated.tolist()
    assert theirs.texts == ours.texts
    assert torch.isnan(theirs.sampler_logprobs).all()  # greedy records no logprobs, as the own engine


@needs_vllm
def test_sampled_logprobs_are_the_sampled_distribution(engine, policy, prompts):
    """T = 0.8, nothing truncated: the sampler logprob of each token = log softmax(logits / T) of a float64
    teacher-forced forward; the group's rows are contiguous; pads carry 0."""
    r = engine.generate(prompts, SamplingParams(group_size=3, max_new_tokens=10, temperature=0.8), seeds=[1, 2, 3, 4])
    assert len(r) == 12 and r.group.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert r.sampler_logprobs_untruncated is None
    worst = 0.0
    for i, comp in enumerate(rows(r)):
        ref = reference_logprobs(policy, prompts[i // 3], comp, 0.8)
        got = r.sampler_logprobs[i, : len(comp)].double()
        worst = max(worst, (got - ref).abs().max().item())
        assert (r.sampler_logprobs[i, len(comp) :] == 0).all()
    assert worst < LOGP_ATOL, worst


@needs_vllm
def test_top_k_logprobs_truncated_and_untruncated(engine, policy, prompts):
    """T = 1, top_k = 5: sampler_logprobs renormalise over the 5 largest logits (what was sampled from), the
    untruncated ones are the full softmax (what the trainer computes); every sampled token is in the top 5."""
    r = engine.generate(prompts[:2], SamplingParams(group_size=2, max_new_tokens=8, top_k=5), seeds=[5, 6])
    assert r.sampler_logprobs_untruncated is not None
    ref = tiny_copy64(policy)
    for i, comp in enumerate(rows(r)):
        prompt = prompts[i // 2]
        with torch.no_grad():
            logits = ref(torch.tensor([prompt + comp])).logits[0, len(prompt) - 1 : -1]
        top = logits.topk(5, dim=-1)
        assert all(c in t for c, t in zip(comp, top.indices.tolist()))
        cut = torch.full_like(logits, float("-inf")).scatter(-1, top.indices, top.values)
        want = token_logprobs(cut, torch.tensor(comp))
        full = token_logprobs(logits, torch.tensor(comp))
        n = len(comp)
        assert (r.sampler_logprobs[i, :n].double() - want).abs().max() < LOGP_ATOL
        assert (r.sampler_logprobs_untruncated[i, :n].double() - full).abs().max() < LOGP_ATOL


@needs_vllm
def test_truncated_temperature_refused(engine, prompts):
    with pytest.raises(ValueError, match="rollout.temperature"):
        engine.generate(prompts[:1], SamplingParams(group_size=2, top_p=0.9, temperature=0.7))


@needs_vllm
def test_seeds_reproduce_and_separate_groups(engine, prompts):
    params = SamplingParams(group_size=4, max_new_tokens=8, temperature=1.0)
    a = engine.generate(prompts[:2], params, seeds=[7, 8])
    b = engine.generate(prompts[:2], params, seeds=[7, 8])
    c = engine.generate(prompts[:2], params, seeds=[9, 10])
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.sampler_logprobs, b.sampler_logprobs)
    assert not torch.equal(a.completion_ids, c.completion_ids)
    assert len({tuple(x) for x in rows(a)[:4]}) > 1  # a group's rows are different draws


@needs_vllm
def test_stop_token_ends_and_is_kept_truncation_flag(engine, tok, prompts):
    params = SamplingParams(greedy=True, max_new_tokens=6)
    free = engine.generate(prompts[:1], params)
    assert free.truncated.tolist() == [True] and free.completion_mask.sum().item() == 6
    # make the greedy path's third token a stop token: the completion ends on it, the mask keeps it
    third = free.completion_ids[0, 2].item()
    first_seen = free.completion_ids[0].tolist().index(third)
    saved = engine.stop_ids
    engine.stop_ids = sorted(set(saved) | {third})
    try:
        stopped = engine.generate(prompts[:1], params)
    finally:
        engine.stop_ids = saved
    assert stopped.truncated.tolist() == [False]
    assert stopped.completion_mask[0].tolist()[: first_seen + 1] == [1] * (first_seen + 1)
    assert stopped.completion_mask.sum().item() == first_seen + 1
    assert stopped.completion_ids[0, first_seen].item() == third


@needs_vllm
def test_sync_weights_reaches_the_engine(engine, policy, tok, prompts):
    """After sync_weights with other weights: the engine's teacher-forced logprobs of a fixed sequence equal the
    new weights' (float64 reference, fp32 tolerance) and greedy follows them; skipping the sync fails both checks.
    The original weights are synced back at the end (the module's engine is shared)."""
    other = tiny_llama(tok, seed=1)
    seq = prompts[1] + tok.encode(" four, I think")
    params = SamplingParams(greedy=True, max_new_tokens=10)

    def engine_matches(model) -> bool:
        got = engine.score([seq])[0].double()
        ref = reference_logprobs(model, seq[:1], seq[1:], 1.0)
        return (got - ref).abs().max().item() < LOGP_ATOL

    assert engine_matches(policy) and not engine_matches(other)  # no sync yet: the engine still has the old weights
    engine.sync_weights(other)
    try:
        assert engine_matches(other) and not engine_matches(policy)
        assert engine.last_sync["bytes"] == sum(
            p.numel() * 4 for _, p in other.named_parameters(remove_duplicate=False)
        )
        assert rows(engine.generate(prompts, params)) == rows(
            GrpolabEngine(other, tok, torch.float32).generate(prompts, params)
        )
    finally:
        engine.sync_weights(policy)
    assert engine_matches(policy)


@needs_vllm
def test_sync_weights_of_a_lora_policy_sends_the_merged_weights(engine, policy, tok, prompts):
    """A LoRA policy (peft) with non-zero B: after the sync the engine computes W + (alpha / r) B A, the peft
    model's own forward; the peft model itself is left unmerged."""
    import copy

    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(copy.deepcopy(policy), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    seq = prompts[1] + tok.encode(" four, I think")
    ref = reference_logprobs(lora, seq[:1], seq[1:], 1.0)
    assert (ref - reference_logprobs(policy, seq[:1], seq[1:], 1.0)).abs().max() > 100 * LOGP_ATOL
    engine.sync_weights(lora)
    try:
        assert (engine.score([seq])[0].double() - ref).abs().max() < LOGP_ATOL
        assert not any(getattr(m, "merged", False) for m in lora.modules())
    finally:
        engine.sync_weights(policy)


@needs_vllm
def test_engine_start_failure_is_one_error_naming_the_fix(policy, tok):
    with pytest.raises(EngineUnavailable, match="did not start.*make install-vllm"):
        VLLMEngine(policy, tok, torch.float32, max_model_len=512, engine_kwargs={"no_such_argument": 1})


@needs_vllm
def test_worker_killed_mid_run_is_a_clear_error(engine, prompts):
    """Runs last: it kills the module's engine."""
    os.kill(engine.pid, signal.SIGKILL)
    with pytest.raises(EngineDied, match=rf"vLLM worker \(pid {engine.pid}\) exited with code -9 during 'generate'"):
        engine.generate(prompts[:1], SamplingParams(greedy=True, max_new_tokens=4))


# -------------------------------------------------------------- the process layer, with stand-in workers (no vLLM)

STAND_IN = """
import socket, sys, time
from multiprocessing.connection import Connection
conn = Connection(socket.socket(fileno=int(sys.argv[2])).detach())
print("stand-in worker up", flush=True)
while True:
    req = conn.recv()
    if req["op"] == "echo":
        conn.send({{"ok": True, "value": req["value"]}})
    elif req["op"] == "fail":
        conn.send({{"ok": False, "error": "Traceback ...\\nValueError: the worker's own error"}})
    elif req["op"] == "stop":
        conn.send({{"ok": True}})
        break
    else:
        {behaviour}
"""


def stand_in(tmp_path, behaviour: str) -> EngineProcess:
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(STAND_IN).format(behaviour=behaviour))
    return EngineProcess(sys.executable, script, tmp_path, "stand-in")


def test_process_answers_and_reports_worker_errors(tmp_path):
    p = stand_in(tmp_path, "pass")
    try:
        assert p.request("echo", 10, value=[1, 2])["value"] == [1, 2]
        with pytest.raises(GrpolabError, match="stand-in worker failed in 'fail': ValueError: the worker's own error"):
            p.request("fail", 10)
    finally:
        p.close()
    assert p.proc.poll() is not None


def test_requests_in_flight_are_answered_in_the_order_sent(tmp_path):
    """send / receive (rollout.max_staleness keeps generations in flight): three requests out, three replies back in
    order; a failing one in the middle raises when its reply is taken, and the next still arrives."""
    p = stand_in(tmp_path, "pass")
    try:
        p.send("echo", value=1)
        p.send("fail")
        p.send("echo", value=3)
        assert p.receive("echo", 10)["value"] == 1
        with pytest.raises(GrpolabError, match="failed in 'fail'"):
            p.receive("fail", 10)
        assert p.receive("echo", 10)["value"] == 3
    finally:
        p.close()


def test_process_death_names_the_worker_and_its_log(tmp_path):
    p = stand_in(tmp_path, "print('about to die', flush=True); sys.exit(3)")
    with pytest.raises(EngineDied, match=r"(?s)exited with code 3 during 'generate'.*about to die"):
        p.request("generate", 30)
    p.close()


def test_process_silence_is_bounded(tmp_path):
    p = stand_in(tmp_path, "time.sleep(600)")
    with pytest.raises(EngineDied, match=r"gave no answer to 'generate' within 1.5 s"):
        p.request("generate", 1.5)
    assert p.proc.poll() is not None  # stopped, not left behind
    p.close()


def test_missing_environment_names_the_make_target(tmp_path):
    with pytest.raises(EngineUnavailable, match="make install-vllm"):
        EngineProcess(tmp_path / "no-such-python", tmp_path / "w.py", tmp_path, "vLLM", None, VLLMEngine.install_hint)


def test_stop_rule_cuts_after_the_fact(tok):
    """rollout.stop_rule code_block on returned tokens: the row ends at the token that closes the first Python
    block, exactly where the decode loop would have stopped; rows without a closed block keep every token."""
    engine = VLLMEngine.__new__(VLLMEngine)  # only the token bookkeeping, no worker
    engine.tokenizer, engine.stop_ids, engine._triggers = tok, [tok.eos_token_id], {}
    closed = tok.encode("Sure:\n```python\nx = 1\n```\nand more text")
    open_ = tok.encode("```python\nx = 1\n")
    lengths = engine._apply_stop_rule([closed, open_], "code_block")
    assert lengths[1] == len(open_)
    cut = tok.decode(closed[: lengths[0]])
    assert cut.rstrip().endswith("```") and "more" not in cut
    assert not tok.decode(closed[: lengths[0] - 1]).rstrip().endswith("```")
    assert engine._apply_stop_rule([closed], "none") == [len(closed)]


@needs_vllm
def test_a_training_run_on_the_vllm_engine(tok, tmp_path):
    """rollout.engine: vllm end to end: two GRPO steps sampled by the worker, each followed by a weight sync; the
    trainer's logprobs of the sampled tokens agree with vLLM's (the mismatch metric), vLLM's version is recorded
    with the library versions, and closing the trainer stops the worker."""
    import json

    import earnable

    from grpolab.config import from_dict
    from grpolab.runs import start_run

    model_dir = tmp_path / "tiny32"
    tiny_llama(tok, seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    cfg = {
        "model": {"name": str(model_dir)},
        "task": {"name": "arithmetic", "options": {"num_train": 16, "num_test": 4}},
        "reward": earnable.reward_config(),
        "rollout": {**earnable.rollout_config(group_size=4), "engine": "vllm", "dtype": "float32"},
        "algorithm": {"beta": 0.0},
        "train": {"steps": 2, "prompts_per_step": 2, "micro_batch_size": 8, "lr": 1e-3, "precision": "fp32"},
        "eval": {"every_steps": 2, "num_problems": 4, "max_new_tokens": 4},
        "run": {"output_dir": str(tmp_path), "name": "vllm-run"},
    }
    trainer, manifest = start_run(from_dict(cfg))
    worker = trainer.engine.process.proc
    try:
        trainer.fit()
    finally:
        trainer.close()
    assert worker.poll() is not None, "close() stops the engine's worker"
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["sync/bytes"] > 0 for r in rows)
    assert all(r["sampler/logp_diff_max"] < LOGP_ATOL for r in rows), [r["sampler/logp_diff_max"] for r in rows]
    assert "eval/accuracy" in rows[-1], "the in-training held-out eval ran on the engine"
    recorded = json.loads((trainer.run_dir / "manifest.json").read_text())
    assert recorded["config"]["rollout"]["engine"] == "vllm" and recorded["versions"]["vllm"] == trainer.engine.version
    assert recorded["objective"]["choices"]["rollout_engine"] == "vllm"


@needs_vllm
def test_an_asynchronous_run_on_the_vllm_engine(tok, tmp_path):
    """rollout.max_staleness 1 on vLLM: step s trains on a batch vLLM sampled before update s - 1 was synced (the
    weight load queued behind the generation in flight), so from step 2 on the sampler's logprobs are one update
    old -- far above the engine-vs-trainer mismatch of a synchronous step -- and step 1's are not."""
    import json

    import earnable

    from grpolab.config import from_dict
    from grpolab.runs import start_run

    model_dir = tmp_path / "tiny32"
    tiny_llama(tok, seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    rollout = {**earnable.rollout_config(group_size=4), "engine": "vllm", "dtype": "float32", "max_staleness": 1}
    cfg = {
        "model": {"name": str(model_dir)},
        "task": {"name": "arithmetic", "options": {"num_train": 16, "num_test": 4}},
        "reward": earnable.reward_config(),
        "rollout": rollout,
        "algorithm": {"beta": 0.0, "is_mode": "token_truncate", "entropy_coef": 0.1},  # moves this model's weights
        "train": {"steps": 3, "prompts_per_step": 2, "micro_batch_size": 8, "lr": 1e-2, "precision": "fp32"},
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(tmp_path), "name": "vllm-async"},
    }
    trainer, _ = start_run(from_dict(cfg))
    try:
        trainer.fit()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["async/staleness"] for r in rows] == [0.0, 1.0, 1.0]
    assert [r["async/policy_version"] for r in rows] == [0.0, 0.0, 1.0]
    assert rows[0]["sampler/logp_diff_max"] < LOGP_ATOL
    assert all(r["sampler/logp_diff_max"] > 10 * LOGP_ATOL for r in rows[1:]), [
        r["sampler/logp_diff_max"] for r in rows
    ]


def test_an_agent_task_is_refused_on_the_vllm_engine(tiny_model_dir, tmp_path):
    """Agent episodes continue each turn on the sampler's own KV cache: one error naming the field, before any
    worker starts (no vLLM needed)."""
    from grpolab.config import from_dict
    from grpolab.errors import ConfigError
    from grpolab.runs import start_run

    cfg = {
        "model": {"name": tiny_model_dir},
        "task": {"name": "agent", "options": {"env": "calc", "num_train": 4, "num_test": 2}},
        "reward": {"weights": {"env": 1.0}},
        "rollout": {"engine": "vllm", "group_size": 2, "dtype": "float32"},
        "train": {"steps": 1, "prompts_per_step": 2, "precision": "fp32"},
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(tmp_path), "name": "agent-vllm"},
    }
    with pytest.raises(ConfigError, match="rollout.engine: expected grpolab for an agent task"):
        start_run(from_dict(cfg))
