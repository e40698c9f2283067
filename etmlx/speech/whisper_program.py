"""A Hugging Face Whisper model as one program of four methods over one state:

- ``audio_preprocessor(samples [window_samples]) -> features [1, n_mels, 3000]``: the
  log-mel front end (``log_mel.LogMel``), float32, from one 30 s window of 16 kHz samples;
- ``audio_encoder(features) -> encoder states [1, 1500, d_model]``: also computes every
  decoder layer's cross-attention keys and values, once per window, into the state;
- ``text_decoder(tokens [1, n], cache_position [n]) -> logits [1, vocab]`` (the last
  position's): self-attention over a static KV cache of ``capacity`` slots, cross-attention
  over what ``audio_encoder`` wrote;
- constant methods: ``sample_rate``, ``window_samples``, ``get_max_context_len``,
  ``get_vocab_size``, ``get_eos_ids``.

Each decoder layer keeps one key buffer and one value buffer, ``[1, heads, encoder
positions + capacity, head_dim]``: the cross-attention's part first, the self-attention's
after it. Both methods write that buffer, so it is the program's mutable state, shared by
name between them (a buffer that a method only reads would be exported as a constant).
ExecuTorch's ASR runner passes the encoder states to every decoder call instead, which
recomputes the cross-attention keys and values at every token."""

import torch
import torch.nn.functional as F
from torch import nn

from .log_mel import LogMel

SAMPLE_RATE = 16000


class WhisperState(nn.Module):
    """Per decoder layer, keys and values: cross-attention's, then self-attention's."""

    def __init__(self, layers: int, heads: int, head_dim: int, encoder_positions: int, capacity: int, dtype):
        super().__init__()
        self.encoder_positions, self.capacity = encoder_positions, capacity
        shape = (1, heads, encoder_positions + capacity, head_dim)
        for i in range(layers):
            self.register_buffer(f"keys_{i}", torch.zeros(shape, dtype=dtype))
            self.register_buffer(f"values_{i}", torch.zeros(shape, dtype=dtype))

    def layer(self, i: int):
        return getattr(self, f"keys_{i}"), getattr(self, f"values_{i}")


def _heads(x, heads: int):
    return x.view(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)


def _merge(x):
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)


class AudioEncoder(nn.Module):
    """``features -> encoder states``, writing each layer's cross-attention keys and values."""

    def __init__(self, model, state: WhisperState):
        super().__init__()
        self.encoder, self.decoder_layers, self.state = model.get_encoder(), model.get_decoder().layers, state

    def forward(self, features):
        states = self.encoder(features.to(self.encoder.conv1.weight.dtype)).last_hidden_state
        positions = self.state.encoder_positions
        for i, layer in enumerate(self.decoder_layers):
            attention = layer.encoder_attn
            keys, values = self.state.layer(i)
            keys[:, :, :positions] = _heads(attention.k_proj(states), attention.num_heads)
            values[:, :, :positions] = _heads(attention.v_proj(states), attention.num_heads)
        return states


class TextDecoder(nn.Module):
    """The last position's logits for ``tokens`` at ``cache_position``, writing their
    self-attention keys and values into the cache."""

    def __init__(self, model, state: WhisperState):
        super().__init__()
        self.decoder, self.proj_out, self.state = model.get_decoder(), model.proj_out, state

    def forward(self, tokens, cache_position):
        decoder, state = self.decoder, self.state
        start = state.encoder_positions
        hidden = decoder.embed_tokens(tokens) + decoder.embed_positions.weight[cache_position]
        visible = torch.arange(state.capacity)[None, :] <= cache_position[:, None]  # causal over the cache
        for i, layer in enumerate(decoder.layers):
            keys, values = state.layer(i)
            attention, x = layer.self_attn, layer.self_attn_layer_norm(hidden)
            heads = attention.num_heads
            keys[:, :, start + cache_position] = _heads(attention.k_proj(x), heads)
            values[:, :, start + cache_position] = _heads(attention.v_proj(x), heads)
            query = _heads(attention.q_proj(x), heads)
            out = F.scaled_dot_product_attention(query, keys[:, :, start:], values[:, :, start:], attn_mask=visible,
                                                 scale=attention.scaling)
            hidden = hidden + attention.out_proj(_merge(out))

            cross, x = layer.encoder_attn, layer.encoder_attn_layer_norm(hidden)
            query = _heads(cross.q_proj(x), heads)
            out = F.scaled_dot_product_attention(query, keys[:, :, :start], values[:, :, :start], scale=cross.scaling)
            hidden = hidden + cross.out_proj(_merge(out))

            x = layer.final_layer_norm(hidden)
            hidden = hidden + layer.fc2(layer.activation_fn(layer.fc1(x)))
        return self.proj_out(decoder.layer_norm(hidden[:, -1:]))[:, 0]  # a slice: a dynamic dim's last


def export_methods(model, feature_extractor, capacity: int) -> dict:
    """``{method name: ExportedProgram or constant}`` of a ``WhisperForConditionalGeneration``
    (for ``etmlx.export_methods``); ``capacity``: the decoder's KV cache, in tokens."""
    from torch.export import Dim

    config = model.config
    if not 2 <= capacity <= config.max_target_positions:
        raise ValueError(f"a decoder cache of {capacity} tokens: expected 2 to the model's "
                         f"{config.max_target_positions} positions")
    attention = model.get_decoder().layers[0].self_attn
    state = WhisperState(config.decoder_layers, attention.num_heads, attention.head_dim,
                         config.max_source_positions, capacity, model.dtype)
    front_end = LogMel(feature_extractor.mel_filters, feature_extractor.n_fft, feature_extractor.hop_length,
                       feature_extractor.n_samples)
    features = torch.zeros(1, feature_extractor.feature_size, front_end.frames)
    seq = Dim("seq", min=1, max=capacity)
    with torch.no_grad():
        methods = {
            "audio_preprocessor": torch.export.export(front_end, (torch.zeros(front_end.window_samples),)),
            "audio_encoder": torch.export.export(AudioEncoder(model, state).eval(), (features,)),
            "text_decoder": torch.export.export(TextDecoder(model, state).eval(),
                                                (torch.zeros(1, 2, dtype=torch.long), torch.arange(2)),
                                                dynamic_shapes=({1: seq}, {0: seq})),
        }
    eos = model.generation_config.eos_token_id
    return {**methods, "sample_rate": SAMPLE_RATE, "window_samples": front_end.window_samples,
            "get_max_context_len": capacity, "get_vocab_size": config.vocab_size,
            "get_eos_ids": [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]}
