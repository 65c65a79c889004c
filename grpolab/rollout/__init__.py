"""Generation: the rollout engine interface and grpolab's own decode loop (docs/performance.md).

- ``base``: RolloutEngine, SamplingParams, Rollout (token ids, logprobs, finish reasons);
- ``hf``: the engine on a transformers model; ``decode``: the batched decode loop (shared-prompt prefill, KV cache
  in ``cache``, finished rows leaving, sampling); ``prepack``: the linear weights prepacked once per
  decode call on a CPU (oneDNN);
- ``stop``: text stop rules (e.g. end the answer at the end of its first code block) and the resolution of
  ``rollout.stop_rule: auto`` from what the run's reward reads;
- ``engine_process``: a worker process spoken to in order with bounded waits (engine-neutral, room for SGLang);
  ``worker_engine``: the trainer-side half of an engine in a worker process (the results contract, stop rules,
  weight syncs, generations kept in flight for rollout.max_staleness);
- ``vllm_engine``: vLLM as the engine (docs/vllm.md); ``vllm_worker``: its worker, run in vLLM's own virtualenv
  (``make install-vllm``) -- it imports only vllm, torch, safetensors and the standard library, never grpolab;
- ``grpolab_worker``: grpolab's own decode loop as a worker process (rollout.engine: grpolab_process).

May import: algo, models. Imported by: rewards (stop rules, the code blocks they read), agents, evaluation,
training, baselines.
"""
