"""grpolab's vLLM plugin (a ``vllm.general_plugins`` entry point, loaded by every vLLM process that loads plugins).

``register`` adds the weight-transfer backend ``gloo`` (grpolab_vllm.gloo_engine) to vLLM's
``WeightTransferEngineFactory``: a server started with ``--weight-transfer-config '{"backend": "gloo"}'`` then
receives the trainer's weights over torch.distributed gloo (TCP), the CPU counterpart of vLLM's own ``nccl`` backend.
"""

BACKEND = "gloo"


def register() -> None:
    """Register the backend once per process (vLLM may load plugins several times)."""
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, "grpolab_vllm.gloo_engine", "GlooWeightTransferEngine")
