"""Models and their files: loading (hub ids, paths, bundled models, run directories), LoRA, checkpoints, export.

- ``load``: model / tokenizer loading, the reference policy, restoring checkpoint weights, merging LoRA adapters;
- ``lora``: LoRA adapters through peft (apply, trainable parameters, the adapter-off reference, saving);
- ``checkpoint``: the run directory's checkpoints (atomic save, newest complete one, RNG state);
- ``direct_io``: checkpoint files written past the page cache (O_DIRECT), each with its CRC-32;
- ``export``: ``grpolab export`` (a Hugging Face directory, merged or as an adapter).

May import: errors (and torch, transformers, peft, safetensors). Imported by everything that runs a model.
"""
