"""The config tree: one frozen dataclass per section (model, task, reward, rollout, algorithm, train, speed, distill,
critic, eval, run). Each field's default is its one definition; AlgorithmConfig's are DeepSeekMath GRPO's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..algo.advantages import Baseline, Scaling, StdKind
from ..algo.aggregation import Aggregation
from ..algo.importance import ISMode, ISReject
from ..algo.kl import KLEstimator, KLPlacement
from ..algo.surrogate import CovSelect, Surrogate


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters through peft (grpolab/models/lora.py): W' = W + (alpha / rank) B A on every targeted module."""

    rank: int = 0  # r; 0 = off (full fine-tuning)
    alpha: float = 16.0  # scaling = alpha / rank
    dropout: float = 0.0  # on the adapters' input, training passes only (old/reference passes run in eval mode)
    target_modules: str | list = "all-linear"  # "all-linear" (every linear layer but the output head) or module names


@dataclass(frozen=True)
class ModelConfig:
    name: str = "bundled:smollm2-135m-instruct"  # hub id, local path, or bundled: alias
    dtype: Literal["float32", "bfloat16"] = "float32"  # master weights
    lora: LoraConfig = LoraConfig()


@dataclass(frozen=True)
class TaskConfig:
    name: str = "arithmetic"
    options: dict = field(default_factory=dict)  # constructor arguments of the task (tasks/__init__.py)


@dataclass(frozen=True)
class RewardModelConfig:
    """The `model` reward's reward model (grpolab/rewards/model.py; docs/reward_models.md)."""

    path: str = ""  # hub id, local directory or `grpolab rm train` run directory
    normalize: bool = False  # z-score the scores of each scored batch
    batch_size: int = 16  # sequences per forward pass
    max_length: int = 512  # tokens kept (the last ones) of each (prompt, completion) text


@dataclass(frozen=True)
class JudgeConfig:
    """The `judge` reward's LLM judge (grpolab/rewards/judge.py; docs/judges.md)."""

    model: str = ""  # local: hub id, local directory or bundled: alias; with endpoint: the served model's name
    endpoint: str = ""  # OpenAI-compatible base URL (e.g. http://127.0.0.1:8000/v1); "" = run the model locally
    api_key_env: str = ""  # environment variable holding the endpoint's API key ("" = none sent)
    rubric: str = ""  # rubric template file: {question}, {answer} (group: {answers}), optional {reference}
    parse: Literal["tag", "json", "yes_no"] = "tag"  # <score>N</score> | JSON {"score": N} | P(yes) (local only)
    mode: Literal["pointwise", "group"] = "pointwise"  # each answer alone | the G answers of a prompt together
    min_score: float = 0.0  # the rubric's scale: reward = (score - min_score) / (max_score - min_score)
    max_score: float = 10.0
    min_yes_no_mass: float = 0.5  # yes_no: P(yes) + P(no) below this = the judge did not answer yes/no (invalid)
    temperature: float = 0.0  # endpoint sampling (a local judge decodes greedily)
    max_new_tokens: int = 64  # the judge's reply (tag / json)
    dtype: Literal["float32", "bfloat16"] = "float32"  # a local judge's weights
    batch_size: int = 8  # local: prompts per forward pass; endpoint: requests in flight
    time_limit_s: float = 30.0  # endpoint: one judgement, its retries included
    retries: int = 3  # endpoint: retries of 408 / 429 / 5xx / connection errors (Retry-After honoured)
    cache: str = "auto"  # auto (grpolab cache dir) | off | a file path (SQLite)


@dataclass(frozen=True)
class RewardConfig:
    weights: dict = field(default_factory=lambda: {"correct": 1.0, "format": 0.1})
    # your own: {name: "path/file.py:fn" | "pkg.mod:fn"} (rewards/user.py)
    functions: dict = field(default_factory=dict)
    time_limit_s: float = 5.0  # per call of each of your functions (the built-ins have their own)
    sandbox: dict = field(default_factory=dict)  # limits of the code rewards' sandbox (grpolab/sandbox/limits.py)
    model: RewardModelConfig = RewardModelConfig()  # the learned reward `model` (weights: {model: 1.0})
    judge: JudgeConfig = JudgeConfig()  # the LLM judge `judge` (weights: {judge: 1.0})


@dataclass(frozen=True)
class RolloutConfig:
    # where rollouts and the in-training held-out eval are generated: grpolab = in this process (rollout.decoder);
    # vllm = vLLM's offline engine in a process and venv of its own (`make install-vllm`; grpolab/rollout/vllm_engine.py);
    # grpolab_process = grpolab's decode loop in a worker process of its own (grpolab/rollout/workers/);
    # vllm_server = vLLM servers over HTTP, weights through vLLM's weight-transfer API (grpolab/rollout/server_engine.py)
    engine: Literal["grpolab", "grpolab_process", "vllm", "vllm_server"] = "grpolab"
    # vllm_server: URLs of running `vllm serve` servers (any host; docs/vllm.md); [] = start num_servers on this host
    servers: list = field(default_factory=list)
    num_servers: int = 1
    # servers started here: each one's devices, one entry per server: cpu:<cores> (e.g. cpu:0-3; its OpenMP threads
    # bound there) or cuda:<GPU ids> (e.g. cuda:1); [] = vLLM's default (on a CPU every server binds from core 0)
    server_devices: list = field(default_factory=list)
    weight_transfer_host: str = ""  # vllm_server: the address servers reach this trainer at ("" = the route's own)
    # vllm_server with LoRA (model.lora.rank > 0): merged = the whole model W + (alpha / r) B A through the weight
    # transfer; adapter = each sync writes only the adapter, which the servers load as a LoRA adapter of its own per
    # version (grpolab/rollout/server_adapters.py): 0.03x the bytes and seconds of a sync, but on a CPU vLLM decodes
    # with adapters 3.6x slower (benchmarks/lora_sync.py, docs/vllm.md), hence merged by default
    lora_sync: Literal["adapter", "merged"] = "merged"
    adapter_dir: str = ""  # lora_sync adapter: where adapters are written for the servers ("" = this host's /dev/shm)
    # k >= 1: the batch of step s is sampled with the weights after update s - k (a fixed lag; the first k steps'
    # with the initial ones) while the trainer updates: an engine in its own process (grpolab_process or vllm) or
    # vLLM servers (vllm_server: a sync pauses them with requests kept, each token then carries the version that
    # sampled it) keeps the next k steps' generations in flight (grpolab/training/pipeline.py; docs/async.md).
    # 0 = synchronous
    max_staleness: int = 0
    worker_threads: int = 0  # grpolab_process: the worker's torch threads (0 = torch's default)
    vllm_python: str = (
        ""  # the vLLM venv's python ("" = .venv-vllm/bin/python of the checkout, or $GRPOLAB_VLLM_PYTHON)
    )
    # bounds in seconds on a worker engine's start (model load) and on each later reply (vllm and grpolab_process);
    # read from their earlier names vllm_start_timeout_s / vllm_call_timeout_s too (FIELDS_RENAMED)
    worker_start_timeout_s: float = 900.0
    worker_call_timeout_s: float = 1800.0
    # grpolab's decode loop (rollout/decode.py); hf: HF generate (the removed choices: REMOVED_CHOICES)
    decoder: Literal["grpolab", "hf"] = "grpolab"
    group_size: int = 8  # G completions per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 64
    # what else ends a completion (rollout/stop.py): code_block = the closing fence of its first Python block (what a
    # code reward reads); auto = code_block when a code reward (all_pass / pass_fraction) is weighted, else none
    stop_rule: Literal["auto", "none", "code_block"] = "auto"
    # the sampler's own weight copy, synced after each update; auto = measured at start (grpolab/training/precision.py;
    # never float16, which is explicit only)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"


@dataclass(frozen=True)
class AlgorithmConfig:
    """The objective's choices. These field defaults are the one definition of the algorithm defaults (DeepSeekMath
    GRPO, the ``grpo`` preset); presets.py writes each other preset as its differences from them, and algo/'s
    parameter classes have no defaults of their own (the trainer fills them from here)."""

    preset: Literal[
        "grpo",
        "dapo",
        "dr_grpo",
        "rloo",
        "gspo",
        "cispo",
        "gmpo",
        "sapo",
        "icepop",
        "scalerl",
        "dppo_tv",
        "dppo_kl",
        "luspo",
    ] = "grpo"
    baseline: Baseline = Baseline.GROUP_MEAN
    scaling: Scaling = Scaling.GROUP_STD
    std_kind: StdKind = StdKind.SAMPLE
    adv_eps: float = 1e-6
    surrogate: Surrogate = Surrogate.PPO_CLIP
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip_c: float = 3.0
    # cispo: the detached IS weight clipped to [1 - cispo_eps_low, 1 + cispo_eps_high] (1.0: no lower bound, as
    # MiniMax-M1; upper 5 = the eps_max TRL recommends for ScaleRL)
    cispo_eps_low: float = 1.0
    cispo_eps_high: float = 4.0
    sapo_tau_pos: float = 1.0  # sapo: gate temperature where A > 0 ...
    sapo_tau_neg: float = 1.05  # ... and where A <= 0 (TRL's and verl's defaults)
    # clip_cov / kl_cov: share of a micro-batch's tokens selected by covariance (floor(ratio N + u) tokens, u uniform:
    # the expected share is cov_ratio at any micro-batch size); clip_cov's covariance bounds; kl_cov's coefficient of
    # |log r| (verl's defaults); clip_cov_select: random = drawn uniformly among the eligible tokens (the paper's,
    # verl's), largest = the largest covariances first
    cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_coef: float = 0.1
    clip_cov_select: CovSelect = CovSelect.RANDOM
    # dppo_tv / dppo_kl: a token's policy term is dropped when the divergence of its sampled token's probability from
    # pi_old's passes dppo_high (A > 0, moving up) or dppo_low (A <= 0, moving down): |p - p_old| for dppo_tv (0.15,
    # the DPPO paper's and verl's example), the binary KL for dppo_kl (its preset: 0.05); the detached ratio of the
    # REINFORCE term is capped at dppo_ratio_cap (verl's in-function default 20; the paper asks for a large cap)
    dppo_low: float = 0.15
    dppo_high: float = 0.15
    dppo_ratio_cap: float = 20.0
    aggregation: Aggregation = Aggregation.SEQ_MEAN_TOKEN_MEAN
    l_max: int = 0  # constant of seq_mean_token_sum_norm; 0 = rollout.max_new_tokens
    beta: float = 0.04
    kl_estimator: KLEstimator = KLEstimator.K3
    kl_placement: KLPlacement = KLPlacement.LOSS
    # DeepSeek-V3.2's unbiased KL (TRL's use_bias_correction_kl): the KL in the loss weighted per token by
    # pi_theta / pi_old, with its gradient (grpolab/algo/kl.py)
    kl_bias_correction: bool = False
    # what the ratio's denominator pi_old is: trainer = the trainer's policy before this update (recomputed; the
    # sampler enters through is_mode); sampler = the sampler's own log-probabilities q (verl's bypass mode; the DPPO
    # paper's and prime-rl's anchor): no recomputation, the clip or trust region then bounds pi_theta / q itself
    pi_old: Literal["trainer", "sampler"] = "trainer"
    is_mode: ISMode = ISMode.NONE
    is_c_max: float = 2.0
    is_c_min: float = 0.5
    # sequence rejection, orthogonal to is_mode: geometric = the geometric mean of pi_old / q over the sequence
    # outside [is_reject_lo, is_reject_hi] (verl's geo_rs bounds)
    is_reject: ISReject = ISReject.NONE
    is_reject_lo: float = 0.999
    is_reject_hi: float = 1.001
    # DeepSeek-V3.2 off-policy sequence masking: a sequence with A < 0 whose mean_t (log q - log pi_theta) exceeds
    # this gets no policy gradient (0 = off)
    offpolicy_mask_delta: float = 0.0
    entropy_coef: float = 0.0
    mask_truncated: bool = False  # drop truncated completions from the loss
    overlong_buffer: int = 0  # DAPO soft overlong punishment: length buffer (0 = off)
    overlong_penalty: float = 1.0  # ... and its maximum penalty
    dynamic_sampling: bool = False  # DAPO: drop zero-variance groups and refill
    max_extra_rounds: int = 0  # refill budget (extra generation rounds per step)
    # advantage estimator: group-relative (GRPO family), pass_at_k = the group's unbiased pass@k gain per sample
    # (grpolab/algo/advantages.py; pass_k, pass_threshold), or gae = PPO with a learned critic (grpolab/baselines/ppo.py)
    # distill = on-policy distillation from distill.teacher (grpolab/training/distill.py); maxrl = (R - mean_g R) /
    # mean_g R; gdpo = each reward component normalised in its group, weighted sum, normalised over the batch
    estimator: Literal["group", "pass_at_k", "gae", "distill", "maxrl", "gdpo"] = "group"
    pass_k: int = 4  # pass_at_k: the k of pass@k (1 <= k < rollout.group_size)
    pass_threshold: float = 1.0  # pass_at_k: a completion passes when its reward is >= this
    # periodic reference reset (ProRL): every N steps the reference model <- the current policy (0 = never); with
    # ref_reset_optimizer the optimizer's moments are cleared at the same time (null: as ProRL, true when
    # ref_reset_every > 0; false keeps them)
    ref_reset_every: int = 0
    ref_reset_optimizer: bool | None = None
    gamma: float = 1.0  # gae: discount
    lam: float = 0.95  # gae: lambda
    whiten: bool = True  # gae: whiten the per-token advantages over the batch


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 20
    prompts_per_step: int = 4
    mu: int = 1  # passes over each rollout batch
    minibatches: int = 1  # optimizer steps per pass
    micro_batch_size: int = 8  # sequences per forward/backward (gradient accumulation inside a minibatch)
    # check = before the first step, three probe updates measure the update's memory and a micro_batch_size that would
    # not fit is refused, naming the largest that does (grpolab/training/memory_fit.py; weights and state put back)
    memory_fit: Literal["check", "off"] = "check"
    lr: float = 1e-6
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    warmup_steps: int = 0
    schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0
    # bf16 = bfloat16 autocast over fp32 master weights; auto = measured at start (grpolab/training/precision.py);
    # fp16 = float16 autocast with dynamic loss scaling (grpolab/training/loss_scale.py), explicit only
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    loss_scale_init: float = 65536.0  # fp16: the initial loss scale (torch.amp.GradScaler's 2^16) ...
    loss_scale_growth_interval: int = 2000  # ... doubled after this many optimizer steps without overflow
    device: str = "auto"  # auto (cuda when available) | cpu | cuda | cuda:N; under torchrun on CUDA: cuda:LOCAL_RANK
    strategy: Literal["ddp", "fsdp2"] = (
        "ddp"  # data parallel: replicated weights, or sharded (grpolab/training/sharding.py)
    )
    seed: int = 0
    # same config + seed on the same machine, threads and versions => the same bytes (grpolab/training/reproducibility.py:
    # deterministic algorithms; on CPU the training passes' attention through SDPA's math backend)
    deterministic: bool = True
    save_every: int = 0  # checkpoint every N steps (0 = off) ...
    save_every_minutes: float = (
        10.0  # ... and/or after this many minutes since the last one (0 = off); always at the end
    )
    keep_last: int = 2
    samples_per_step: int = 4
    max_nonfinite_steps: int = 3  # stop after this many consecutive steps with a NaN/Inf loss or gradient
    # prompt order (grpolab/training/prompt_sampler.py): shuffle = each prompt once per epoch; pass_rate = prompts whose last
    # group was solved G/G or 0/G are skipped except with probability prompt_floor (and after ceil(1/floor) skips)
    prompt_schedule: Literal["shuffle", "pass_rate"] = "shuffle"
    prompt_floor: float = 0.25


@dataclass(frozen=True)
class SpeedConfig:
    """How fast a run computes, never what it optimises: each switch keeps the objective, the data and the sampler's
    distribution as they are (some sum the same numbers in another order). `grpolab manifest diff` lists them apart
    from the differences that matter, a resume accepts a change of them (recorded; the bitwise claim is downgraded),
    and each one's measured effect is in docs/performance.md."""

    # grpolab decoder on a CPU, float32 (or bfloat16 where the CPU has bf16 units): weights packed once per decode call
    # for oneDNN (rollout/prepack.py); false = every product re-packs its weight
    cpu_fast_paths: bool = True
    # grpolab decoder: the KV cache written in place into buffers allocated once per decode call for prompt +
    # max_new_tokens (rollout/cache.py); false = transformers' default, a concatenation per step
    preallocate_kv_cache: bool = True
    # with bf16 on CPU: attention in float32 (its bf16 backward is slow; grpolab/training/attention.py)
    attention_fp32: bool = True
    share_prompt: bool = True  # training passes run each prompt once per micro-batch, not once per completion
    pack_completions: bool = True  # with share_prompt: completions packed end to end, not padded (SDPA models)
    fused_adamw: bool = True  # torch's fused AdamW kernel (same update as foreach, one pass over the weights)
    keep_freed_memory: bool = True  # CPU: malloc keeps freed memory for reuse (grpolab/training/cpu_memory.py)
    checkpoint_direct_io: bool = True  # write checkpoints past the page cache, O_DIRECT (grpolab/models/direct_io.py)


# Where each speed switch lived before it moved to `speed:`; a config or recorded manifest that still sets one
# there is read as the new field, with a warning (move_speed_fields).
FIELDS_RENAMED = {  # (section, earlier name) -> the field's name now: configs and manifests of earlier runs still load
    ("rollout", "vllm_start_timeout_s"): "worker_start_timeout_s",
    ("rollout", "vllm_call_timeout_s"): "worker_call_timeout_s",
}

SPEED_FIELDS_MOVED = {
    "cpu_fast_paths": "rollout",
    "preallocate_kv_cache": "rollout",
    "attention_fp32": "train",
    "share_prompt": "train",
    "pack_completions": "train",
    "fused_adamw": "train",
    "keep_freed_memory": "train",
    "checkpoint_direct_io": "train",
}


@dataclass(frozen=True)
class DistillConfig:
    """On-policy distillation (algorithm.estimator = distill): the student samples, the teacher scores the student's
    tokens, and each token's advantage is the negative reverse KL, log pi_teacher - log pi_student, optionally
    mixed with the group advantage of the task reward."""

    teacher: str = ""  # hub id, local path, bundled: alias or a `grpolab train` run directory; same tokenizer
    reward_weight: float = 0.0  # A_it = (log pi_T - log pi_old)(o_it) + reward_weight * A_i
    dtype: Literal["float32", "bfloat16"] = "float32"  # the teacher's weights


@dataclass(frozen=True)
class CriticConfig:
    """The value model of algorithm.estimator = gae (grpolab/baselines/critic.py); trained for train.mu x train.minibatches
    steps per batch, like the policy."""

    share_backbone: bool = False  # False: value head on a copy of the policy's backbone; True: on the policy's own
    lr: float = 1e-5
    value_clip: float = 0.2  # clip of V - V_old in the value loss (0 = off)
    grad_clip: float = 1.0


@dataclass(frozen=True)
class EvalConfig:
    every_steps: int = 0  # periodic held-out eval during training (0 = off)
    num_problems: int = 64
    split: str = "test"
    max_new_tokens: int = 0  # 0 = rollout.max_new_tokens
    batch_size: int = 64


@dataclass(frozen=True)
class RunConfig:
    output_dir: str = "runs"
    name: str = ""  # "" = <task>-<preset>-<timestamp>
    # experiment trackers fed beside metrics.jsonl (grpolab/training/trackers.py; docs/tracking.md): any of
    # tensorboard, wandb (offline), mlflow; each needs its extra (pip install 'grpolab[tensorboard]' ...)
    report_to: list = field(default_factory=list)
    mlflow_tracking_uri: str = ""  # "" = a local SQLite store under RUN_DIR/mlflow (mlflow ui --backend-store-uri ...)
    table_every_steps: int = 0  # a completions table to the trackers every N steps (0 = off)
    table_groups: int = 4  # groups per table (all their completions), zero-variance groups included


@dataclass(frozen=True)
class Config:
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    reward: RewardConfig = RewardConfig()
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    train: TrainConfig = TrainConfig()
    speed: SpeedConfig = SpeedConfig()
    distill: DistillConfig = DistillConfig()
    eval: EvalConfig = EvalConfig()
    critic: CriticConfig = CriticConfig()
    run: RunConfig = RunConfig()

    @property
    def l_max(self) -> int:
        return self.algorithm.l_max or self.rollout.max_new_tokens
