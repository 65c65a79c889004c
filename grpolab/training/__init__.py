"""The GRPO training loop and everything only it uses (docs/design.md §3).

- ``trainer``: the loop, top to bottom (sample a batch, score, advantages, policy update, log, checkpoint, eval);
  ``builders``: the parts it is assembled from (problems, rewards, policy, reference, optimizer), one concern each;
  ``checkpointing``: its checkpoints (what one holds, save, exact restore, the best by held-out accuracy);
- ``estimators``: the advantage estimator registry (algorithm.estimator); ``group_rules``: advantages and signal at
  collection; ``pipeline``: asynchronous rollouts with a staleness bound (rollout.max_staleness);
- ``batch``: collecting a batch of groups (dynamic sampling, reward scoring, advantages); ``agent_batch``: the same
  for multi-turn agent episodes; ``prompt_sampler``: the order prompts are drawn in (and its schedules);
- ``update``: the policy update (micro-batches, the loss of grpolab.algo, gradient steps); ``forward``: the logprob
  passes (shared prompt, packed completions); ``packing``, ``attention``: their building blocks;
- ``distill``: on-policy distillation (algorithm.estimator = distill: the teacher, its per-token advantages);
  ``reference``: the periodic reference reset (algorithm.ref_reset_every) and its part of a checkpoint;
- ``precision``: fp32 / bf16 (the probe, GRPOLAB_PRECISION); ``loss_scale``: fp16's dynamic loss scale;
  ``reproducibility``: deterministic kernels;
  ``cpu_memory``: freed memory kept (mallopt); ``process_settings``: both held for a run and put back after it;
  ``schedule``: the learning-rate schedule;
- ``distributed``, ``sharding``: torchrun ranks (DDP / FSDP2); ``faults``: interrupts and non-finite steps;
  ``sampler_faults``: a sampler lost mid-run (stopped with a checkpoint);
- ``metrics``: metrics.jsonl / samples.jsonl and the metric names; ``trackers``: TensorBoard / W&B / MLflow beside
  them; ``progress_lines``: the one-line summary of a step printed by the CLI and the API; ``truncation``: most
  completions cut in the first steps (a warning, truncation.json);
- ``bench``: ``grpolab bench`` (trainer-only and end-to-end tokens/s, MFU, peak memory); ``flops``: the model FLOPs
  it and benchmarks/ count, the matmul rate; ``memory_fit``: the largest micro-batch that fits, from a probe;
  ``estimate``: step time and memory on a named GPU from its spec sheet.

May import: algo, config, errors, tasks, models, rollout, rewards, agents, evaluation (periodic held-out eval).
Never imported by: evaluation, rewards, rollout, models, tasks (layering contract in pyproject.toml).
"""
