"""The worker processes of the engines that sample outside the trainer's process (docs/vllm.md, docs/async.md).

- ``process``: ``EngineProcess``, a worker spoken to in order over a socket pair with bounded waits (engine-neutral);
- ``vllm_worker``: vLLM's worker, run as a script in vLLM's own virtualenv -- it imports only vllm, torch,
  safetensors and the standard library, never grpolab; it holds the request loop both workers serve;
- ``grpolab_worker``: grpolab's own decode loop (grpolab.rollout.grpolab_engine) as a worker, run as a script with
  the trainer's Python (rollout.engine: grpolab_process).

The trainer-side halves are grpolab.rollout.worker_engine (the results contract) and grpolab.rollout.vllm_engine.
"""
