"""A tiny Llama as a GGUF file, llama.cpp's format, written with the ``gguf`` package:
``examples.llm``'s architecture and trained tokenizer, and random but valid blocks of a
chosen quantization type for every matrix (nothing is downloaded or quantized here).

    python -m examples.llm_gguf tiny.gguf --type Q4_K
    etmlx export-llm tiny.gguf -o tiny/model.pte
"""

import argparse
import json

import numpy as np

from examples import llm

# type -> the fp16 fields of its blocks: (byte offset, low, high) of the values written,
# chosen so that every weight is about N(0, 0.25) (a minimum cancels its scale's mean).
_FP16_FIELDS = {
    "Q8_0": [(0, 0.002, 0.004)], "Q4_0": [(0, 0.01, 0.03)], "Q4_1": [(0, 0.01, 0.03), (2, -0.2, -0.1)],
    "Q5_0": [(0, 0.005, 0.015)], "Q5_1": [(0, 0.005, 0.015), (2, -0.2, -0.1)],
    "Q4_K": [(0, 0.0005, 0.0015), (2, 0.004, 0.011)], "Q5_K": [(0, 0.0003, 0.0008), (2, 0.005, 0.012)],
    "Q6_K": [(208, 0.0002, 0.0006)], "Q2_K": [(80, 0.001, 0.003), (82, 0.001, 0.003)],
    "Q3_K": [(108, 0.001, 0.003)],
}
Q6_K_SCALES = slice(192, 208)  # a Q6_K block's 16 int8 sub-block scales


def random_blocks(rng, kind: str, rows: int, columns: int, paired_q6k_scales: bool = False):
    """``(rows, row bytes)`` uint8 of valid ``kind`` blocks holding a ``(rows, columns)``
    weight; ``paired_q6k_scales``: each pair of Q6_K sub-blocks shares its scale."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, columns // values, size), dtype=np.uint8)
    for offset, low, high in _FP16_FIELDS[kind]:
        field = rng.uniform(low, high, size=raw.shape[:2]).astype(np.float16)
        raw[..., offset:offset + 2] = field[..., None].view(np.uint8)
    if kind == "Q6_K" and paired_q6k_scales:
        scales = raw[..., Q6_K_SCALES]  # a view: written through
        scales[..., 1::2] = scales[..., 0::2]
    return raw.reshape(rows, -1)


def tiny_gguf(path, kind: str = "Q4_K", types: dict = None, seed: int = 0, hidden: int = 256, layers: int = 2,
              max_cache: int = llm.MAX_CACHE, tied: bool = False, paired_q6k_scales: bool = False) -> str:
    """Writes ``path``: a Llama (hidden ``hidden``, 4 heads, 2 kv) whose matrices are
    ``kind`` blocks (``types``: {GGUF tensor name suffix, e.g. "ffn_down.weight": type}
    overrides), norms F32, ``tied``: no ``output.weight`` (the head is the embedding)."""
    config = llm.tiny_llama(seed, max_cache, hidden=hidden, layers=layers).config
    return write_gguf(path, config, llm.train_tokenizer(config.vocab_size), kind, types, seed, tied, paired_q6k_scales)


def write_gguf(path, config, tokenizer, kind: str = "Q4_K", types: dict = None, seed: int = 0, tied: bool = False,
               paired_q6k_scales: bool = False) -> str:
    """Writes ``path``: the Llama of ``config`` as ``tiny_gguf`` describes, its vocabulary
    ``tokenizer``'s tokens and as many filler tokens as ``config.vocab_size`` needs more.
    The tensors are drawn and written one at a time (an 8B model is never whole in memory)."""
    import gguf
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        shapes = {name: tuple(t.shape) for name, t in LlamaForCausalLM(config).state_dict().items()}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    _add_tokenizer(writer, tokenizer, config.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    planned = []  # (GGUF name, shape, type or None for F32)
    for name, shape in shapes.items():
        base, suffix = name.rsplit(".", 1)
        gguf_name = f"{names.get_name(base)}.{suffix}"
        if len(shape) == 1:
            planned.append((gguf_name, shape, None))
        elif not (tied and gguf_name == "output.weight"):
            planned.append((gguf_name, shape, next((t for end, t in (types or {}).items() if gguf_name.endswith(end)),
                                                   kind)))
    for gguf_name, shape, chosen in planned:
        if chosen is None:
            writer.add_tensor_info(gguf_name, shape, np.dtype(np.float32), 4 * shape[0])
        else:
            qtype = gguf.GGMLQuantizationType[chosen]
            values, size = gguf.GGML_QUANT_SIZES[qtype]
            row_bytes = shape[1] // values * size
            writer.add_tensor_info(gguf_name, (shape[0], row_bytes), np.dtype(np.uint8), shape[0] * row_bytes, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for gguf_name, shape, chosen in planned:
        if chosen is None:
            writer.write_tensor_data((1 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
        else:
            writer.write_tensor_data(random_blocks(rng, chosen, *shape, paired_q6k_scales))
    writer.close()
    return str(path)


def _add_tokenizer(writer, tokenizer, vocab_size: int) -> None:
    """``tokenizer`` (a byte-level BPE) as llama.cpp's "gpt2" tokenizer metadata, its
    vocabulary padded to ``vocab_size`` with filler tokens no merge makes."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    tokens = sorted(state["vocab"], key=state["vocab"].get)
    special = set(tokenizer.all_special_tokens)
    types = [3 if token in special else 1 for token in tokens]  # 3: control
    tokens += [f"<filler_{i}>" for i in range(vocab_size - len(tokens))]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types + [1] * (len(tokens) - len(types)))
    writer.add_token_merges([merge if isinstance(merge, str) else " ".join(merge) for merge in state["merges"]])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_unk_token_id(tokenizer.unk_token_id)
    writer.add_chat_template(llm.CHAT_TEMPLATE)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--type", default="Q4_K", choices=sorted(_FP16_FIELDS))
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    print(tiny_gguf(args.path, args.type, hidden=args.hidden, layers=args.layers))


if __name__ == "__main__":
    main()
