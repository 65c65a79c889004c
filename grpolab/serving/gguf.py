"""Convert a release bundle -- a Hugging Face ``LlamaForCausalLM`` directory -- to one GGUF file that llama.cpp serves
as it is (gguf-py writes it; llama.cpp is not needed to convert). What llama.cpp's own ``convert_hf_to_gguf.py``
does for this architecture, done here for the one family grpolab bundles:

- **Hyperparameters** (``llama.*`` keys): block count, context length (max_position_embeddings), embedding and
  feed-forward lengths, head counts (query and key/value), rope base (rope_theta), rope dimension (head_dim),
  RMS-norm epsilon, vocabulary size. RoPE scaling, attention or MLP biases: not handled (GrpolabError).
- **Tensors**: the Hugging Face names mapped to llama.cpp's (``model.layers.3.self_attn.q_proj.weight`` ->
  ``blk.3.attn_q.weight``, gguf-py's tensor name map); a tied output projection is not written (llama.cpp reads
  ``token_embd`` for it). 1-D tensors (the RMS-norm weights) are written F32 whatever the type, as llama.cpp's
  converter does; 2-D tensors in the chosen type: ``f32``, ``bf16`` (torch's round-to-nearest-even cast, the same
  bits a bf16 bundle holds) or ``f16``.
- **The Q/K permutation.** Hugging Face's Llama rotates the pair of dimensions (i, i + d/2) of each head
  (``rotate_half``); llama.cpp's LLAMA rope rotates adjacent pairs (2i, 2i + 1). So the rows of ``q_proj`` (per
  query head) and ``k_proj`` (per key/value head) are reordered within each head of d rows: GGUF row
  h*d + 2i + j = Hugging Face row h*d + j*d/2 + i (i < d/2, j in {0, 1}), i.e.
  ``W.reshape(H, 2, d/2, -1).swapaxes(1, 2).reshape(H*d, -1)`` (permute_rope_rows). Without it the file loads and
  answers, but every attention score is wrong.
- **Tokenizer**: ``tokenizer.ggml.model = gpt2`` (byte-level BPE): every token as the tokenizer spells it (ids
  the tokenizer lacks below vocab_size become ``[PAD<i>]``, UNUSED), its type (special added token: CONTROL; other
  added token: USER_DEFINED; else NORMAL), the merges, bos / unk / pad ids, whether the tokenizer adds bos or eos
  itself, and the pre-tokenizer's llama.cpp name, read from tokenizer.json's ``pre_tokenizer`` (pre_tokenizer_name).
- **Chat template**: the bundle's (``tokenizer.chat_template``), byte for byte.
- **End ids**: generation_config.json's ``eos_token_id`` list (the ids the run stopped on): the tokenizer's eos
  (or the first end id) as ``tokenizer.ggml.eos_token_id``, a second as ``eot_token_id``, a third as
  ``eom_token_id``; GGUF has no field for more (GrpolabError). llama.cpp also ends generation on tokens it
  recognises by their text (``<|endoftext|>``, ``<|im_end|>``, ...): the serving check reports the set it uses.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ..errors import GrpolabError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)
GGUF_TYPES = ("f32", "bf16", "f16")
BUNDLE_HASH_KEY = "grpolab.bundle_weights_sha256"  # the bundle's weights hash (release.json), when it has one
GPT2_PRE = "gpt-2"  # ByteLevel with its GPT-2 regex, in llama.cpp and in tokenizers alike
SMOLLM_PRE = "smollm"  # every digit split off first (\p{N}), then the GPT-2 regex


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise GrpolabError(
            f"{path}: cannot read the {what} ({type(e).__name__}); expected a Hugging Face model "
            f"directory such as a release bundle"
        ) from None


def llama_hparams(config: dict[str, Any], where: Path) -> dict[str, Any]:
    """The llama.cpp hyperparameters of a Hugging Face Llama config.json; GrpolabError naming the field for an
    architecture or a feature this converter does not handle.

    >>> llama_hparams({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 32,
    ...     "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 10,
    ...     "max_position_embeddings": 128, "rms_norm_eps": 1e-5}, Path("c.json"))["head_dim"]
    8
    """
    arch = (config.get("architectures") or [None])[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GrpolabError(
            f"{where}: architectures is {config.get('architectures')!r}; the GGUF converter handles "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} only (llama.cpp's convert_hf_to_gguf.py covers others)"
        )
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise GrpolabError(
            f"{where}: rope type {rope.get('rope_type', rope.get('type'))!r}; the GGUF converter "
            f"handles the default rope only (no scaling)"
        )
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            raise GrpolabError(f"{where}: {flag} is true; the GGUF converter handles bias-free Llama layers only")
    heads = config["num_attention_heads"]
    return {
        "blocks": config["num_hidden_layers"],
        "context": config.get("max_position_embeddings", 2048),
        "embedding": config["hidden_size"],
        "ffn": config["intermediate_size"],
        "heads": heads,
        "kv_heads": config.get("num_key_value_heads") or heads,
        "head_dim": config.get("head_dim") or config["hidden_size"] // heads,
        "rope_theta": float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        "rms_eps": float(config.get("rms_norm_eps", 1e-6)),
        "vocab": config["vocab_size"],
        "tied": bool(config.get("tie_word_embeddings", False)),
    }


def permute_rope_rows(weight, n_head: int):
    """Reorder the rows of a q_proj / k_proj weight [n_head * d, in] from Hugging Face's half-split rope layout to
    llama.cpp's interleaved one (module docstring): W.reshape(n_head, 2, d/2, in).swapaxes(1, 2).reshape(W.shape).

    >>> import torch
    >>> permute_rope_rows(torch.arange(8.0).view(8, 1), 2).view(-1).tolist()  # 2 heads of d = 4
    [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]
    """
    rows = weight.shape[0]
    return weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def pre_tokenizer_name(spec: dict[str, Any] | None, where: str = "tokenizer.json") -> str:
    """llama.cpp's name for a tokenizers ``pre_tokenizer``: ByteLevel with its regex and no prefix space ->
    ``gpt-2``; Digits(individual_digits) then that ByteLevel -> ``smollm``. Anything else: GrpolabError (a wrong
    name would make llama.cpp cut the text otherwise than the run's tokenizer did).

    >>> pre_tokenizer_name({"type": "ByteLevel", "add_prefix_space": False, "use_regex": True})
    'gpt-2'
    """

    def byte_level(p: dict[str, Any]) -> bool:
        return p.get("type") == "ByteLevel" and p.get("use_regex", True) and not p.get("add_prefix_space", False)

    spec = spec or {}
    if byte_level(spec):
        return GPT2_PRE
    steps = (spec.get("pretokenizers") or []) if spec.get("type") == "Sequence" else []
    if (
        len(steps) == 2
        and steps[0].get("type") == "Digits"
        and steps[0].get("individual_digits")
        and byte_level(steps[1])
    ):
        return SMOLLM_PRE
    raise GrpolabError(
        f"{where}: pre_tokenizer {json.dumps(spec)[:200]} has no llama.cpp pre-tokenizer this "
        f"converter knows; supported: ByteLevel with its GPT-2 regex ({GPT2_PRE!r}) and "
        f"Digits(individual_digits) + ByteLevel ({SMOLLM_PRE!r})"
    )


def end_id_fields(end_ids: list[int], tokenizer_eos: int | None, where: str) -> dict[str, int]:
    """GGUF fields for the generation config's end ids: eos (the tokenizer's eos when it is one of them, else the
    first), then eot, then eom.

    >>> end_id_fields([2, 7], 2, "g.json"), end_id_fields([9, 4], 4, "g.json")
    ({'eos': 2, 'eot': 7}, {'eos': 4, 'eot': 9})
    """
    if not end_ids:
        raise GrpolabError(f"{where}: no eos_token_id; a served model needs its end-of-turn ids")
    first = tokenizer_eos if tokenizer_eos in end_ids else end_ids[0]
    rest = [i for i in end_ids if i != first]
    if len(rest) > 2:
        raise GrpolabError(
            f"{where}: {len(end_ids)} end ids {end_ids}; a GGUF file carries at most three "
            f"(tokenizer.ggml.eos_token_id, eot_token_id, eom_token_id)"
        )
    return dict(zip(("eos", "eot", "eom"), [first, *rest]))


def tokenizer_fields(model_dir: Path, vocab_size: int) -> dict[str, Any]:
    """The tokenizer of a model directory as GGUF fields (module docstring): tokens, types, merges, pre-tokenizer,
    special ids, add_bos / add_eos, chat template, end ids."""
    import gguf
    from transformers import AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    spec = json.loads(tok.backend_tokenizer.to_str())
    model, where = spec.get("model") or {}, f"{model_dir}/tokenizer.json"
    if model.get("type") != "BPE" or model.get("byte_fallback") or spec.get("normalizer"):
        raise GrpolabError(
            f"{where}: a {model.get('type')} model (byte_fallback {model.get('byte_fallback')}, "
            f"normalizer {spec.get('normalizer')}); the GGUF converter handles byte-level BPE "
            f"without a normalizer (tokenizer.ggml.model gpt2) only"
        )
    pre = pre_tokenizer_name(spec.get("pre_tokenizer"), where)
    reverse = {i: t for t, i in tok.get_vocab().items()}
    if max(reverse) >= vocab_size:
        raise GrpolabError(f"{where}: token id {max(reverse)} is not below config.json vocab_size {vocab_size}")
    added = tok.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(reverse[i])
        types.append(
            gguf.TokenType.NORMAL
            if i not in added
            else gguf.TokenType.CONTROL
            if added[i].special
            else gguf.TokenType.USER_DEFINED
        )
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    probe, bare = tok("a")["input_ids"], tok("a", add_special_tokens=False)["input_ids"]
    try:
        end = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:
        end = None
    if isinstance(end, int):
        end = [end]
    elif not end:
        end = [] if tok.eos_token_id is None else [tok.eos_token_id]
    return {
        "tokens": tokens,
        "types": types,
        "merges": merges,
        "pre": pre,
        "bos": tok.bos_token_id,
        "unk": tok.unk_token_id,
        "pad": tok.pad_token_id,
        "chat_template": tok.chat_template,
        "add_bos": len(probe) > len(bare) and probe[0] == tok.bos_token_id,
        "add_eos": len(probe) > len(bare) and probe[-1] == tok.eos_token_id,
        "end_ids": end_id_fields(end, tok.eos_token_id, f"{model_dir}/generation_config.json"),
    }


def _write_metadata(
    writer, h: dict[str, Any], t: dict[str, Any], name: str, outtype: str, bundle_hash: str | None
) -> None:
    import gguf

    writer.add_name(name)
    writer.add_file_type(
        {
            "f32": gguf.LlamaFileType.ALL_F32,
            "f16": gguf.LlamaFileType.MOSTLY_F16,
            "bf16": gguf.LlamaFileType.MOSTLY_BF16,
        }[outtype]
    )
    writer.add_block_count(h["blocks"])
    writer.add_context_length(h["context"])
    writer.add_embedding_length(h["embedding"])
    writer.add_feed_forward_length(h["ffn"])
    writer.add_head_count(h["heads"])
    writer.add_head_count_kv(h["kv_heads"])
    writer.add_rope_freq_base(h["rope_theta"])
    writer.add_layer_norm_rms_eps(h["rms_eps"])
    writer.add_vocab_size(h["vocab"])
    writer.add_rope_dimension_count(h["head_dim"])
    if h["head_dim"] != h["embedding"] // h["heads"]:
        writer.add_key_length(h["head_dim"])
        writer.add_value_length(h["head_dim"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(t["pre"])
    writer.add_token_list(t["tokens"])
    writer.add_token_types(t["types"])
    writer.add_token_merges(t["merges"])
    writer.add_add_space_prefix(False)
    writer.add_add_bos_token(t["add_bos"])
    writer.add_add_eos_token(t["add_eos"])
    for key, add in (
        ("bos", writer.add_bos_token_id),
        ("unk", writer.add_unk_token_id),
        ("pad", writer.add_pad_token_id),
    ):
        if t[key] is not None:
            add(t[key])
    ends = t["end_ids"]
    writer.add_eos_token_id(ends["eos"])
    if "eot" in ends:
        writer.add_eot_token_id(ends["eot"])
    if "eom" in ends:
        writer.add_eom_token_id(ends["eom"])
    if t["chat_template"]:
        writer.add_chat_template(t["chat_template"])
    if bundle_hash:
        writer.add_string(BUNDLE_HASH_KEY, bundle_hash)


def gguf_tensors(state: dict[str, Any], h: dict[str, Any], outtype: str, permute: bool = True):
    """(llama.cpp name, numpy array, GGML type) of each tensor to write: the name map, the Q/K row permutation and
    the precision rule of the module docstring. permute=False exists for the test that shows the permutation is
    needed; a file written so answers wrongly."""
    import gguf
    import torch

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, h["blocks"])
    for hf_name, tensor in state.items():
        if hf_name.endswith("rotary_emb.inv_freq") or (h["tied"] and hf_name == "lm_head.weight"):
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise GrpolabError(
                f"tensor {hf_name}: no llama.cpp name for it; the GGUF converter handles "
                f"{', '.join(SUPPORTED_ARCHITECTURES)} tensors only"
            )
        if permute and hf_name.endswith("q_proj.weight"):
            tensor = permute_rope_rows(tensor, h["heads"])
        elif permute and hf_name.endswith("k_proj.weight"):
            tensor = permute_rope_rows(tensor, h["kv_heads"])
        if tensor.dim() == 1 or outtype == "f32":
            yield name, tensor.to(torch.float32).contiguous().numpy(), gguf.GGMLQuantizationType.F32
        elif outtype == "f16":
            yield name, tensor.to(torch.float16).contiguous().numpy(), gguf.GGMLQuantizationType.F16
        else:
            bits = tensor.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view("uint16")
            yield name, bits, gguf.GGMLQuantizationType.BF16


def read_state(model_dir: Path) -> dict[str, Any]:
    """Every tensor of the directory's *.safetensors files, by name."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise GrpolabError(f"{model_dir}: no *.safetensors weights; expected a Hugging Face model directory")
    state: dict[str, Any] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def convert_to_gguf(model_dir: Path, out: Path, outtype: str = "f32", permute: bool = True) -> dict[str, Any]:
    """Write `model_dir` (a release bundle or any Hugging Face LlamaForCausalLM directory) to the GGUF file `out`
    (written beside it and renamed into place); return what was written: path, type, bytes, seconds, tensors,
    pre-tokenizer, end ids."""
    import gguf

    model_dir, out = Path(model_dir), Path(out)
    if outtype not in GGUF_TYPES:
        raise GrpolabError(f"GGUF type {outtype!r}: expected one of {', '.join(GGUF_TYPES)}")
    start = time.perf_counter()
    h = llama_hparams(_read_json(model_dir / "config.json", "model config"), model_dir / "config.json")
    t = tokenizer_fields(model_dir, h["vocab"])
    release = model_dir / "release.json"
    bundle_hash = (
        (_read_json(release, "release manifest").get("hashes") or {}).get("weights") if release.is_file() else None
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    writer = gguf.GGUFWriter(str(tmp), arch=gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    try:
        _write_metadata(writer, h, t, model_dir.name, outtype, bundle_hash)
        count = 0
        for name, array, kind in gguf_tensors(read_state(model_dir), h, outtype, permute):
            writer.add_tensor(name, array, raw_dtype=kind)
            count += 1
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return {
        "path": str(out),
        "type": outtype,
        "bytes": out.stat().st_size,
        "seconds": time.perf_counter() - start,
        "tensors": count,
        "pre_tokenizer": t["pre"],
        "end_ids": t["end_ids"],
        "bundle_weights": bundle_hash,
    }


def _as_float(data, kind) -> Any:
    """A GGUF tensor's values as float32 (F32, F16, or BF16 stored as raw bytes)."""
    import gguf
    import numpy as np

    raw = np.ascontiguousarray(data)
    if kind == gguf.GGMLQuantizationType.BF16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if kind == gguf.GGMLQuantizationType.F16:
        return raw.view(np.float16).astype(np.float32)
    return raw.view(np.float32)


def weights_against_gguf(model, path: Path, bundle_dtype) -> dict[str, Any]:
    """Each tensor of the GGUF file against the evaluated model's tensor it comes from: that tensor cast to the
    bundle's precision, then put through gguf_tensors' rule (Q/K permutation, the file's type), bitwise. Same
    fields as grpolab.serving.check.weights_against: tensors, identical, max_abs_diff, only_in_bundle (GGUF names
    the model has no source for), plus missing (expected names the file lacks)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(path))
    file_type = int(reader.fields["general.file_type"].contents())
    outtype = {
        int(gguf.LlamaFileType.ALL_F32): "f32",
        int(gguf.LlamaFileType.MOSTLY_F16): "f16",
        int(gguf.LlamaFileType.MOSTLY_BF16): "bf16",
    }.get(file_type)
    if outtype is None:
        raise GrpolabError(f"{path}: general.file_type {file_type}; expected an f32, f16 or bf16 file")
    h = llama_hparams(model.config.to_dict(), Path(path))
    state = {k: v.detach().to(bundle_dtype) for k, v in model.state_dict().items()}
    expected = {name: (array, kind) for name, array, kind in gguf_tensors(state, h, outtype)}
    equal, worst, extra = 0, 0.0, []
    for t in reader.tensors:
        if t.name not in expected:
            extra.append(t.name)
            continue
        array, kind = expected.pop(t.name)
        got = np.ascontiguousarray(t.data)
        if t.tensor_type == kind and got.tobytes() == np.ascontiguousarray(array).tobytes():
            equal += 1
        elif t.tensor_type != kind or got.nbytes != array.nbytes:
            worst = float("inf")
        else:
            diff = np.abs(_as_float(got, kind).reshape(-1) - _as_float(array, kind).reshape(-1)).max()
            worst = max(worst, float(diff))
    return {
        "tensors": len(reader.tensors),
        "identical": equal,
        "max_abs_diff": worst,
        "only_in_bundle": extra[:5],
        "missing": sorted(expected)[:5],
    }
