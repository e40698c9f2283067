"""Checkpoint folders of real models' shapes, with random bfloat16 weights, written tensor by
tensor (an 8B model is never whole in memory): what a user downloads, for the export
benchmarks. Sharded at 4 GiB with a ``model.safetensors.index.json``, as the Hub's are;
the tokenizer is examples/llm.py's tiny one (its ids are the first of the model's vocabulary).

    python bench/checkpoints.py llama-3.2-1b DIR [--layers N]
    python bench/checkpoints.py llama-3.2-1b FILE.gguf --gguf Q4_K

or, with ``--gguf TYPE``, a GGUF file of that shape: every matrix random but valid
blocks of TYPE, norms F32 (examples/llm_gguf.py; the head tied as in the model).
"""

import argparse
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
# The shapes of the Hub's configs (meta-llama/Llama-3.2-1B, Llama-3.1-8B).
SHAPES = {
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
                         rope_parameters={"rope_theta": 500000.0, "factor": 32.0, **LLAMA3_ROPE}),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
                         rope_parameters={"rope_theta": 500000.0, "factor": 8.0, **LLAMA3_ROPE}),
}
SHARD_BYTES = 4 * 2**30
STD = 0.02  # transformers' initializer_range for Llama


def config_of(shape: str, layers=None):
    from transformers import LlamaConfig

    sizes = dict(SHAPES[shape])
    if layers is not None:
        sizes["num_hidden_layers"] = layers
    return LlamaConfig(vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, bos_token_id=1,
                       eos_token_id=2, dtype="bfloat16", **sizes)


def write_checkpoint(directory, shape: str, layers=None, seed: int = 0) -> str:
    """Writes ``config.json``, ``model-*.safetensors`` with their index, and the tokenizer
    into ``directory``; returns it. Each tensor is drawn (normal, ``STD``; norms at 1),
    written and dropped before the next."""
    import torch
    from transformers import AutoModelForCausalLM

    from examples import llm

    config = config_of(shape, layers)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight")
    os.makedirs(directory, exist_ok=True)
    shards, size = [[]], 0
    for name, shape_ in shapes.items():
        nbytes = 2 * _count(shape_)
        if size + nbytes > SHARD_BYTES and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    generator = torch.Generator().manual_seed(seed)
    weight_map = {}
    for index, names in enumerate(shards):
        file = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        _write_shard(os.path.join(directory, file), names, shapes, generator)
        weight_map.update(dict.fromkeys(names, file))
    total = sum(2 * _count(s) for s in shapes.values())
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    config.save_pretrained(directory)
    tokenizer = llm.train_tokenizer()
    tokenizer.chat_template = llm.CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    return str(directory)


def write_gguf(path, shape: str, kind: str, layers=None, seed: int = 0) -> str:
    """Writes the GGUF file ``path`` of ``shape``, its matrices ``kind`` blocks; returns it."""
    from examples import llm, llm_gguf

    config = config_of(shape, layers)
    return llm_gguf.write_gguf(path, config, llm.train_tokenizer(), kind, seed=seed, tied=config.tie_word_embeddings)


def _count(shape) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _write_shard(path, names, shapes, generator) -> None:
    """safetensors' layout: an 8-byte header size, the JSON header, then the tensors in order."""
    import torch

    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in names:
        nbytes = 2 * _count(shapes[name])
        header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name in names:
            if name.endswith("norm.weight"):
                tensor = torch.ones(shapes[name], dtype=torch.bfloat16)
            else:
                tensor = (torch.randn(shapes[name], generator=generator) * STD).to(torch.bfloat16)
            f.write(tensor.view(torch.uint8).numpy().data)
            del tensor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shape", choices=SHAPES)
    parser.add_argument("directory", help="the checkpoint folder, or with --gguf the file")
    parser.add_argument("--layers", type=int, help="fewer (or more) decoder layers than the model has")
    parser.add_argument("--gguf", metavar="TYPE", help="a GGUF file of TYPE blocks (Q4_0, Q4_K, Q8_0, ...)")
    args = parser.parse_args()
    if args.gguf:
        print(write_gguf(args.directory, args.shape, args.gguf, args.layers))
    else:
        print(write_checkpoint(args.directory, args.shape, args.layers))


if __name__ == "__main__":
    main()
