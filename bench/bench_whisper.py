"""Whisper's real-time factor: one 30 s window (log-mel front end, encoder, then a prompt
of 4 tokens and --tokens greedy steps) with etmlx on both runtimes, transformers eager,
and mlx-whisper (PyPI's MLX Whisper, if installed: `pip install mlx-whisper`), in one run,
on checkpoints of whisper-tiny's and whisper-base's shapes (random weights, float32).

    python bench/bench_whisper.py [--shapes tiny base] [--tokens 64] [--repeats 3]

Every engine does the same work: no early stop at EOS (random weights), one decoding pass
(transformers' plain ``GenerationMixin.generate``, not Whisper's seeking loop). RTF is the
seconds per 30 s of audio divided by 30: below 1 is faster than real time.
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from timing import best_of  # noqa: E402

SHAPES = {  # d_model, layers (encoder and decoder each), heads: openai/whisper-tiny and -base
    "tiny": (384, 4, 6),
    "base": (512, 6, 8),
}
VOCAB, PROMPT = 51865, [50258, 50259, 50360, 50364]  # multilingual Whisper: SOT, <|en|>, transcribe, notimestamps


def write_checkpoint(directory: str, shape: str) -> str:
    import torch
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    d_model, layers, heads = SHAPES[shape]
    torch.manual_seed(0)
    config = WhisperConfig(vocab_size=VOCAB, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                           encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=4 * d_model,
                           decoder_ffn_dim=4 * d_model, decoder_start_token_id=PROMPT[0])
    WhisperForConditionalGeneration(config).save_pretrained(directory)
    WhisperFeatureExtractor(feature_size=80).save_pretrained(directory)
    return directory


def etmlx_window(program, samples, tokens: int) -> list:
    import torch

    features = program.run_method("audio_preprocessor", [torch.from_numpy(samples)])[0]
    program.run_method("audio_encoder", [features])
    logits = program.run_method("text_decoder", [torch.tensor([PROMPT]), torch.arange(len(PROMPT))])[0]
    out = []
    for position in range(len(PROMPT), len(PROMPT) + tokens):
        out.append(int(np.asarray(logits).argmax()))
        logits = program.run_method("text_decoder", [torch.tensor([[out[-1]]]), torch.tensor([position])])[0]
    return out


def transformers_window(model, extractor, samples, tokens: int) -> list:
    import torch
    from transformers import GenerationMixin

    features = extractor(samples, sampling_rate=16000, return_tensors="pt").input_features
    with torch.no_grad():
        out = GenerationMixin.generate(model, input_features=features, decoder_input_ids=torch.tensor([PROMPT]),
                                       max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    return out[0, len(PROMPT):].tolist()


def mlx_whisper_model(model):
    """mlx-whisper's model with the same weights, float32 (its float16 default is slow on the CPU)."""
    import mlx.core as mx
    from mlx.utils import tree_unflatten
    from mlx_whisper.whisper import ModelDimensions, Whisper

    config = model.config
    dims = ModelDimensions(n_mels=config.num_mel_bins, n_audio_ctx=config.max_source_positions,
                           n_audio_state=config.d_model, n_audio_head=config.encoder_attention_heads,
                           n_audio_layer=config.encoder_layers, n_vocab=config.vocab_size,
                           n_text_ctx=config.max_target_positions, n_text_state=config.d_model,
                           n_text_head=config.decoder_attention_heads, n_text_layer=config.decoder_layers)
    ours = Whisper(dims, dtype=mx.float32)
    weights = {}
    for name, tensor in model.model.state_dict().items():
        mapped = _mlx_whisper_name(name)
        if mapped is not None:
            value = tensor.float().numpy()
            weights[mapped] = mx.array(value.transpose(0, 2, 1) if "conv" in name and value.ndim == 3 else value)
    ours.update(tree_unflatten(list(weights.items())))
    mx.eval(ours.parameters())
    return ours


def _mlx_whisper_name(name: str):
    """transformers' parameter names -> mlx-whisper's (the names OpenAI's checkpoints use)."""
    replacements = [("encoder.layers.", "encoder.blocks."), ("decoder.layers.", "decoder.blocks."),
                    ("self_attn_layer_norm", "attn_ln"), ("encoder_attn_layer_norm", "cross_attn_ln"),
                    ("final_layer_norm", "mlp_ln"), ("encoder_attn.", "cross_attn."), ("self_attn.", "attn."),
                    ("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value"), ("out_proj", "out"),
                    ("fc1", "mlp1"), ("fc2", "mlp2"), ("encoder.layer_norm", "encoder.ln_post"),
                    ("decoder.layer_norm", "decoder.ln"), ("embed_tokens", "token_embedding"),
                    ("decoder.embed_positions.weight", "decoder.positional_embedding")]
    if name == "encoder.embed_positions.weight":
        return None  # sinusoids, which mlx-whisper computes
    for old, new in replacements:
        name = name.replace(old, new)
    return name


def mlx_whisper_window(model, samples, tokens: int) -> list:
    import mlx.core as mx
    from mlx_whisper.audio import log_mel_spectrogram

    mel = log_mel_spectrogram(samples)[:3000]
    audio = model.embed_audio(mel[None])
    logits, cache, _ = model.decoder(mx.array([PROMPT]), audio)
    out = []
    for _ in range(tokens):
        out.append(int(mx.argmax(logits[0, -1]).item()))
        logits, cache, _ = model.decoder(mx.array([[out[-1]]]), audio, kv_cache=cache)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["tiny", "base"])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import etmlx
    from etmlx.runtime_shim.blas import preload_openblas
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    from examples.speech import speech_like

    print(f"{os.cpu_count()} cores; BLAS: {preload_openblas()}; one 30 s window, {args.tokens} greedy tokens, float32")
    try:
        import mlx_whisper  # noqa: F401
    except ImportError:
        mlx_whisper = None
        print("mlx-whisper is not installed (pip install mlx-whisper): its column is left out")
    samples = speech_like(30.0)
    for shape in args.shapes:
        with tempfile.TemporaryDirectory() as directory:
            folder = write_checkpoint(os.path.join(directory, shape), shape)
            pte = os.path.join(directory, "whisper.pte")
            started = time.perf_counter()
            etmlx.export_llm(folder, pte)
            exported = time.perf_counter() - started
            model = WhisperForConditionalGeneration.from_pretrained(folder).eval()
            extractor = WhisperFeatureExtractor.from_pretrained(folder)
            rows = [(f"etmlx ({runtime})", best_of(args.repeats, lambda p=etmlx.load(pte, runtime=runtime):
                                                  etmlx_window(p, samples, args.tokens)))
                    for runtime in etmlx.RUNTIMES]
            rows.append(("transformers eager", best_of(args.repeats,
                                                       lambda: transformers_window(model, extractor, samples,
                                                                                   args.tokens))))
            if mlx_whisper is not None:
                theirs = mlx_whisper_model(model)
                rows.append(("mlx-whisper", best_of(args.repeats, lambda: mlx_whisper_window(theirs, samples,
                                                                                              args.tokens))))
            reference = rows[-2][1][1] if mlx_whisper is not None else rows[-1][1][1]
            print(f"\nwhisper-{shape} shape (exported in {exported:.1f} s)")
            print(f"{'':<22}{'s/window':>10}{'RTF':>8}{'vs etmlx (python)':>20}  same tokens as transformers")
            for name, (seconds, tokens) in rows:
                print(f"{name:<22}{seconds:>10.3f}{seconds / 30:>8.3f}{seconds / rows[0][1][0]:>19.2f}x  "
                      f"{tokens == reference}")


if __name__ == "__main__":
    main()
