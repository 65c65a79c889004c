"""Generation: the rollout engines' interfaces, their registry and grpolab's own decode loop (docs/performance.md).

- ``base``: the ``RolloutEngine`` (synchronous) and ``QueuedEngine`` (asynchronous) protocols, SamplingParams,
  Rollout (token ids, logprobs, finish reasons);
- ``engines``: the registry of engines keyed by rollout.engine (grpolab, grpolab_process, vllm, vllm_server);
- ``grpolab_engine``: grpolab's in-process engine on a transformers model; ``decode``: the batched decode loop
  (shared-prompt prefill, KV cache in ``cache``, finished rows leaving, sampling); ``prepack``: the linear weights
  prepacked once per decode call on a CPU (oneDNN);
- ``stop``: text stop rules (e.g. end the answer at the end of its first code block) and the resolution of
  ``rollout.stop_rule: auto`` from what the run's reward reads;
- ``worker_engine``: the trainer-side half of an engine in a worker process (the results contract, stop rules,
  weight syncs, generations kept in flight for rollout.max_staleness); ``vllm_engine``: vLLM's trainer-side half
  (docs/vllm.md);
- ``server_engine``: vLLM servers as the engine over HTTP; ``servers``: their client, the servers started here and
  the checks before training; ``server_adapters``: LoRA adapters synced to them alone (rollout.lora_sync);
  ``weight_transfer``: the trainer's side of vLLM's weight-transfer API (gloo);
- ``workers``: the worker processes (grpolab.rollout.workers).

May import: algo, models. Imported by: rewards (stop rules, the code blocks they read), agents, evaluation,
training, baselines.
"""
