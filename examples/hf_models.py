"""Tiny Hugging Face transformers models, built from small configs with random weights
(nothing is downloaded). Each factory returns ``(module, example_inputs, dynamic_shapes)``
for ``etmlx export examples/hf_models.py:FACTORY``; ``dynamic=True`` makes the sequence
length dynamic where the model allows (batch 2: torch.export specializes a batch of 1).
"""

import os

import torch
from torch import nn
from torch.export import Dim

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from configs: nothing to download

VOCAB = 128
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)


class Logits(nn.Module):
    """The tensor users want out of a transformers model, without its output dataclass."""

    def __init__(self, model, field="logits"):
        super().__init__()
        self.model, self.field = model, field

    def forward(self, inputs):
        return getattr(self.model(inputs), self.field)


def _tokens(seq=8):
    torch.manual_seed(0)
    return (torch.randint(0, VOCAB, (2, seq)),)


def _sequence_dim(dynamic, max_len=32):
    return ({1: Dim("seq", min=2, max=max_len)},) if dynamic else None


def tiny_llama(dynamic=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, num_key_value_heads=2, max_position_embeddings=64, use_cache=False, **SMALL)
    return Logits(LlamaForCausalLM(config).eval()), _tokens(), _sequence_dim(dynamic)


def tiny_gpt2(dynamic=False):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False)
    return Logits(GPT2LMHeadModel(config).eval()), _tokens(), _sequence_dim(dynamic)


def tiny_bert(dynamic=False):
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=VOCAB, max_position_embeddings=64, **SMALL)
    return Logits(BertModel(config).eval(), "last_hidden_state"), _tokens(), _sequence_dim(dynamic)


def tiny_vit():
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=32, patch_size=8, num_channels=3, num_labels=10, **SMALL)
    torch.manual_seed(0)
    return Logits(ViTForImageClassification(config).eval()), (torch.randn(2, 3, 32, 32),), None


def tiny_resnet():
    from transformers import ResNetConfig, ResNetModel

    config = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")
    torch.manual_seed(0)
    return Logits(ResNetModel(config).eval(), "pooler_output"), (torch.randn(2, 3, 32, 32),), None


def _whisper():
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
        num_mel_bins=16, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_source_positions=32, max_target_positions=32, use_cache=False,
    )
    torch.manual_seed(0)
    return WhisperForConditionalGeneration(config).eval()


class WhisperEncoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, features):
        return self.encoder(features).last_hidden_state


class WhisperDecoderStep(nn.Module):
    """Decoder logits for the tokens so far, cross-attending to the encoder states."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens, encoder_states):
        return self.model(decoder_input_ids=tokens, encoder_outputs=(encoder_states,)).logits


def tiny_whisper_encoder():
    model = _whisper()
    return WhisperEncoder(model), (torch.randn(2, 16, 64),), None  # 16 mel bins x 2 * max_source_positions


def tiny_whisper_decoder(dynamic=False):
    model = _whisper()
    with torch.no_grad():
        states = WhisperEncoder(model)(torch.randn(2, 16, 64))
    inputs = (torch.randint(0, VOCAB, (2, 5)), states)
    return WhisperDecoderStep(model), inputs, ({1: Dim("seq", min=2, max=32)}, None) if dynamic else None
