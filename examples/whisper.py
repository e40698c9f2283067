"""Whisper decoding on MLX with a static self-attention KV cache.

transformers' seq2seq export wrapper does not survive ExecuTorch's decompositions with
this torch (an aliased-argument wrapper in AOT autograd), so ``DecoderWithCache`` is
a small wrapper that runs a Hugging Face Whisper decoder's own layers and weights over
a cache held in module buffers. Cross-attention keys and values are recomputed from
the encoder states on each call.
"""

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from configs: nothing to download


class DecoderWithCache(nn.Module):
    """Logits for ``tokens`` at ``cache_position`` given the encoder states, writing the
    tokens' self-attention keys and values into the cache."""

    def __init__(self, model, max_length: int = 32):
        super().__init__()
        self.decoder, self.proj_out = model.get_decoder(), model.proj_out
        attention = self.decoder.layers[0].self_attn
        self.heads, self.head_dim = attention.num_heads, attention.head_dim
        for i in range(len(self.decoder.layers)):
            self.register_buffer(f"key_cache_{i}", torch.zeros(1, self.heads, max_length, self.head_dim))
            self.register_buffer(f"value_cache_{i}", torch.zeros(1, self.heads, max_length, self.head_dim))

    def _heads(self, x):
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def _merge(self, x):
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], self.heads * self.head_dim)

    def forward(self, tokens, encoder_states, cache_position):
        positions = self.decoder.embed_positions.weight[cache_position]
        hidden = self.decoder.embed_tokens(tokens) + positions
        max_length = self.key_cache_0.shape[2]
        visible = torch.arange(max_length)[None, :] <= cache_position[:, None]  # causal over the cache
        for i, layer in enumerate(self.decoder.layers):
            attention, x = layer.self_attn, layer.self_attn_layer_norm(hidden)
            keys, values = getattr(self, f"key_cache_{i}"), getattr(self, f"value_cache_{i}")
            keys[:, :, cache_position] = self._heads(attention.k_proj(x))
            values[:, :, cache_position] = self._heads(attention.v_proj(x))
            query = self._heads(attention.q_proj(x) * attention.scaling)
            out = F.scaled_dot_product_attention(query, keys, values, attn_mask=visible, scale=1.0)
            hidden = hidden + attention.out_proj(self._merge(out))

            cross, x = layer.encoder_attn, layer.encoder_attn_layer_norm(hidden)
            query = self._heads(cross.q_proj(x) * cross.scaling)
            out = F.scaled_dot_product_attention(
                query, self._heads(cross.k_proj(encoder_states)), self._heads(cross.v_proj(encoder_states)), scale=1.0
            )
            hidden = hidden + cross.out_proj(self._merge(out))

            x = layer.final_layer_norm(hidden)
            hidden = hidden + layer.fc2(layer.activation_fn(layer.fc1(x)))
        return self.proj_out(self.decoder.layer_norm(hidden))


def export_methods(model, encoder_states, max_length: int = 32) -> dict:
    """``{"prefill": ..., "decode": ...}`` over one cache; prefill takes 2..max_length tokens."""
    wrapper = DecoderWithCache(model, max_length).eval()
    seq = Dim("seq", min=2, max=max_length)
    with torch.no_grad():
        prefill = torch.export.export(
            wrapper,
            (torch.zeros(1, 3, dtype=torch.long), encoder_states, torch.arange(3)),
            dynamic_shapes=({1: seq}, None, {0: seq}),
        )
        decode = torch.export.export(wrapper, (torch.zeros(1, 1, dtype=torch.long), encoder_states, torch.tensor([0])))
    return {"prefill": prefill, "decode": decode}


def greedy(program, prompt: list, encoder_states, steps: int) -> list:
    tokens = list(prompt)
    logits = program.prefill(torch.tensor([prompt]), encoder_states, torch.arange(len(prompt)))
    for _ in range(steps):
        tokens.append(int(logits[0, -1].argmax()))
        position = len(tokens) - 1
        logits = program.decode(torch.tensor([[tokens[-1]]]), encoder_states, torch.tensor([position]))
    return tokens


def eager_greedy(model, prompt: list, encoder_states, steps: int) -> list:
    """The reference: the Hugging Face model itself, re-reading all tokens each step."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(decoder_input_ids=torch.tensor([tokens]), encoder_outputs=(encoder_states,)).logits
            tokens.append(int(logits[0, -1].argmax()))
    return tokens


def main() -> None:
    """Exports a tiny Whisper decoder with its cache, decodes a few steps with etmlx, and
    compares with the Hugging Face model in eager PyTorch."""
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import etmlx  # noqa: F401  (before mlx: OpenBLAS)
    import hf_models

    model = hf_models._whisper()
    torch.manual_seed(1)
    with torch.no_grad():
        states = hf_models.WhisperEncoder(model)(torch.randn(1, 16, 64))
    os.makedirs("out", exist_ok=True)
    result = etmlx.export_methods(export_methods(model, states), os.path.join("out", "tiny_whisper_decoder.pte"))
    print(f"wrote {result.path} ({result.size_bytes} bytes); {result.report.summary()}")
    prompt = [1, 7, 30]
    tokens = greedy(etmlx.load(result.path), prompt, states, 8)
    eager = eager_greedy(model, prompt, states, 8)
    print(f"etmlx: {tokens[len(prompt):]}\neager: {eager[len(prompt):]}")
    if tokens != eager:
        sys.exit("etmlx tokens differ from eager PyTorch")
    print("tokens equal the Hugging Face model's greedy tokens")


if __name__ == "__main__":
    main()
