"""A tiny Whisper checkpoint folder as users have one (config, safetensors, tokenizer,
generation and preprocessor configs), random weights, and WAV files to transcribe: what the
speech tests, the benchmark and the README's walk-through export.

    python examples/speech.py /tmp/whisper   # writes the folder and /tmp/whisper/speech.wav
"""

import os
import sys
import wave

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))

from llm import train_tokenizer  # noqa: E402

LANGUAGES = ("en", "de", "fr")
TIMESTAMPS = 1501  # <|0.00|> to <|30.00|>, 20 ms apart


def whisper_tokenizer(text_tokens: int = 256):
    """``train_tokenizer``'s BPE with Whisper's special tokens after the text ones, in
    Whisper's order: <|endoftext|>, <|startoftranscript|>, the languages, the tasks,
    <|startoflm|>, <|startofprev|>, <|nospeech|>, <|notimestamps|>, the timestamps."""
    tokenizer = train_tokenizer(text_tokens)
    specials = (["<|endoftext|>", "<|startoftranscript|>"] + [f"<|{code}|>" for code in LANGUAGES]
                + ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                   "<|notimestamps|>"] + [f"<|{i * 0.02:.2f}|>" for i in range(TIMESTAMPS)])
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.eos_token = tokenizer.pad_token = "<|endoftext|>"
    return tokenizer


def tiny_whisper_checkpoint(directory, seed: int = 0, d_model: int = 64, layers: int = 2, heads: int = 2,
                            max_target_positions: int = 64, init_std: float = 0.5) -> str:
    """Writes a Whisper folder into ``directory`` (its path): weights drawn with a large
    enough spread that greedy text varies, a multilingual generation config."""
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    tokenizer = whisper_tokenizer()
    token = tokenizer.convert_tokens_to_ids
    config = WhisperConfig(
        vocab_size=len(tokenizer), num_mel_bins=80, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model, max_source_positions=1500, max_target_positions=max_target_positions,
        decoder_start_token_id=token("<|startoftranscript|>"), eos_token_id=token("<|endoftext|>"),
        pad_token_id=token("<|endoftext|>"), bos_token_id=token("<|endoftext|>"), init_std=init_std,
    )
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id, bos_token_id=config.bos_token_id, max_length=max_target_positions,
        is_multilingual=True, lang_to_id={f"<|{code}|>": token(f"<|{code}|>") for code in LANGUAGES},
        task_to_id={"transcribe": token("<|transcribe|>"), "translate": token("<|translate|>")},
        no_timestamps_token_id=token("<|notimestamps|>"), max_initial_timestamp_index=50,
        suppress_tokens=[token("<|startoflm|>"), token("<|startofprev|>"), token("<|nospeech|>")],
        begin_suppress_tokens=[token(" "), config.eos_token_id],
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    WhisperFeatureExtractor(feature_size=80).save_pretrained(directory)
    return str(directory)


def speech_like(seconds: float, rate: int = 16000, seed: int = 0) -> np.ndarray:
    """Float samples in [-1, 1]: gliding tones in bursts over a little noise."""
    rng = np.random.default_rng(seed)
    time = np.arange(int(seconds * rate)) / rate
    pitch = 180 + 60 * np.sin(2 * np.pi * 0.7 * time)
    bursts = 0.5 + 0.5 * np.sign(np.sin(2 * np.pi * 2.5 * time))
    voice = np.sin(2 * np.pi * np.cumsum(pitch) / rate) + 0.4 * np.sin(4 * np.pi * np.cumsum(pitch) / rate)
    return (0.3 * bursts * voice + 0.01 * rng.standard_normal(time.size)).astype(np.float32)


def write_wav(path, samples: np.ndarray, rate: int = 16000, channels: int = 1, sample_width: int = 2) -> str:
    """Writes ``samples`` (floats in [-1, 1], repeated over ``channels``) as integer PCM."""
    scale = {1: 127, 2: 32767, 4: 2147483647}[sample_width]
    pcm = np.round(np.clip(samples, -1, 1) * scale)
    pcm = (pcm + 128).astype(np.uint8) if sample_width == 1 else pcm.astype(f"<i{sample_width}")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(sample_width)
        out.setframerate(rate)
        out.writeframes(np.repeat(pcm[:, None], channels, axis=1).tobytes())
    return str(path)


if __name__ == "__main__":
    folder = sys.argv[1] if len(sys.argv) > 1 else "whisper-tiny-random"
    tiny_whisper_checkpoint(folder)
    print(f"wrote {folder} and {write_wav(os.path.join(folder, 'speech.wav'), speech_like(4.0))}")
