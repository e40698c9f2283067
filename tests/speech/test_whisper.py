"""Whisper: one export of a tiny random checkpoint folder, transcribed on both runtimes
(``runtimes.load`` runs every call on each and checks they agree) and compared with
transformers' ``generate`` on the feature extractor's features."""

import os
import subprocess
import sys
import wave

import numpy as np
import pytest
import torch

import etmlx
import runtimes
from etmlx.speech.audio import AudioError, read_wav, resample
from etmlx.speech.transcribe import Transcriber, TranscriptionError
from examples import speech

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    """(checkpoint folder, .pte, export result, eager model, feature extractor)."""
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    folder = speech.tiny_whisper_checkpoint(tmp_path_factory.mktemp("whisper") / "checkpoint")
    pte = os.path.join(tmp_path_factory.mktemp("exported"), "whisper.pte")
    result = etmlx.export_llm(folder, pte)
    model = WhisperForConditionalGeneration.from_pretrained(folder).eval()
    return folder, pte, result, model, WhisperFeatureExtractor.from_pretrained(folder)


@pytest.fixture(scope="module")
def transcriber(whisper):
    return Transcriber(runtimes.load(whisper[1]), os.path.dirname(whisper[1]))


def eager(model, extractor, samples, **options) -> list:
    """transformers' greedy tokens of each decoding pass over up to 30 s of audio (the
    prompt and EOS left out): a pass that ends inside a segment is followed by one from
    that segment's start."""
    features = extractor(samples, sampling_rate=16000, return_tensors="pt").input_features
    with torch.no_grad():
        segments = model.generate(features, max_new_tokens=NEW_TOKENS, return_segments=True, **options)["segments"][0]
    passes, last, eos = [], None, model.generation_config.eos_token_id
    for segment in segments:  # a pass's segments share its result: the prompt, then what it generated
        if segment["result"] is not last:
            last = segment["result"]
            tokens = last.tolist()[segment["idxs"][0]:]
            while tokens and tokens[-1] == eos:
                tokens.pop()
            passes.append(tokens)
    return passes


def test_the_program_is_whole_on_mlx_with_the_cross_attention_in_the_state(whisper):
    from etmlx.inspection import inspect_program

    _, pte, result, _, _ = whisper
    assert result.report.fully_delegated
    methods = inspect_program(pte)["methods"]
    delegate = {name: methods[name]["delegates"] for name in ("audio_preprocessor", "audio_encoder", "text_decoder")}
    assert all(len(delegates) == 1 and not methods[name]["kernels"] for name, delegates in delegate.items())
    nodes = {name: set(delegates[0]["nodes"]) for name, delegates in delegate.items()}
    assert {"Matmul", "Concatenate", "Log10"} <= nodes["audio_preprocessor"]  # the STFT, as products
    assert "Sdpa" in nodes["audio_encoder"] and "Sdpa" in nodes["text_decoder"]
    for name in ("audio_encoder", "text_decoder"):  # both write each layer's keys and values: one state
        buffers = {buffer["name"] for buffer in delegate[name][0]["buffers"]}
        assert buffers == {f"state.{kind}_{i}" for kind in ("keys", "values") for i in range(2)}
    assert os.path.isfile(os.path.join(os.path.dirname(pte), "preprocessor_config.json"))


@pytest.mark.parametrize("seconds", [4.0, 30.0])
def test_the_front_end_computes_the_feature_extractors_features(whisper, seconds):
    _, pte, _, _, extractor = whisper
    samples = speech.speech_like(seconds)
    window = np.zeros(480000, dtype=np.float32)
    window[:samples.size] = samples
    features = runtimes.load(pte).run_method("audio_preprocessor", [torch.from_numpy(window)])[0]
    expected = extractor(samples, sampling_rate=16000, return_tensors="np").input_features
    np.testing.assert_allclose(np.asarray(features), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("options", [dict(language="en"), dict(), dict(language="german", task="translate"),
                                     dict(language="de", timestamps=True)], ids=["en", "detected", "translate", "timestamps"])
def test_a_window_is_transcribed_as_transformers_generates_it(whisper, transcriber, options):
    _, _, _, model, extractor = whisper
    samples = speech.speech_like(6.0, seed=1)
    transcript = transcriber.transcribe(samples, max_new_tokens=NEW_TOKENS, **options)
    timestamps = options.pop("timestamps", False)
    expected = eager(model, extractor, samples, return_timestamps=timestamps, **options)
    assert transcript.tokens == expected and len(set(expected[0])) > 3
    if timestamps:
        assert transcript.segments and all(s.start <= s.end for s in transcript.segments)


def test_long_audio_is_transcribed_window_after_window(whisper, transcriber):
    _, _, _, model, extractor = whisper
    samples = speech.speech_like(65.0, seed=2)
    transcript = transcriber.transcribe(samples, language="en", timestamps=True, max_new_tokens=NEW_TOKENS)
    windows = [samples[i:i + 480000] for i in range(0, samples.size, 480000)]
    assert transcript.tokens == [tokens for w in windows
                                 for tokens in eager(model, extractor, w, language="en", return_timestamps=True)]
    assert any(segment.start >= 60 for segment in transcript.segments)


def test_wav_files_of_every_pcm_width_rate_and_channel_count_read_alike(tmp_path):
    samples = speech.speech_like(1.0)
    for width in (1, 2, 3, 4):
        if width == 3:  # 24-bit: written by hand, wave has no numpy type for it
            pcm = np.round(np.clip(samples, -1, 1) * (2 ** 23 - 1)).astype("<i4").view(np.uint8).reshape(-1, 4)[:, :3]
            with wave.open(str(tmp_path / "24.wav"), "wb") as out:
                out.setnchannels(1), out.setsampwidth(3), out.setframerate(16000)
                out.writeframes(pcm.tobytes())
            path = str(tmp_path / "24.wav")
        else:
            path = speech.write_wav(tmp_path / f"{width}.wav", samples, sample_width=width, channels=2)
        read, rate = read_wav(path)
        assert rate == 16000 and read.shape == samples.shape
        np.testing.assert_allclose(read, samples, atol=2.0 / (2 ** (8 * width - 1)) + 1e-6)


def test_resampling_keeps_a_tone_below_both_nyquists():
    time = np.arange(44100 * 2) / 44100
    tone = np.sin(2 * np.pi * 440 * time).astype(np.float32)
    at_16k = resample(tone, 44100, 16000)
    expected = np.sin(2 * np.pi * 440 * np.arange(32000) / 16000)
    assert at_16k.shape == (32000,)
    np.testing.assert_allclose(at_16k[1000:-1000], expected[1000:-1000], atol=1e-3)  # the ends wrap


def test_transcribe_prints_the_text_of_a_stereo_44k_file(whisper, transcriber, tmp_path):
    _, pte, _, _, _ = whisper
    wav = speech.write_wav(tmp_path / "stereo.wav", speech.speech_like(3.0, rate=44100), rate=44100, channels=2)
    done = subprocess.run([sys.executable, "-m", "etmlx.cli", "transcribe", pte, wav, "--language", "en",
                           "--max-new-tokens", str(NEW_TOKENS), "--runtime", "executorch"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    expected = transcriber.transcribe(*read_wav(wav), language="en", max_new_tokens=NEW_TOKENS)
    assert done.stdout.strip() == expected.text and expected.text


def _run_transcribe(*args):
    return subprocess.run([sys.executable, "-m", "etmlx.cli", "transcribe", *args], capture_output=True, text=True,
                          timeout=300)


def test_bad_audio_gets_one_line_naming_the_problem(whisper, tmp_path):
    _, pte, _, _, _ = whisper
    not_wav = tmp_path / "notes.wav"
    not_wav.write_bytes(b"ID3 this is an mp3 header, not RIFF")
    empty = speech.write_wav(tmp_path / "empty.wav", np.zeros(0, dtype=np.float32))
    float_wav = tmp_path / "float.wav"  # WAVE_FORMAT_IEEE_FLOAT (3), which wave does not read
    data = np.zeros(16, dtype="<f4").tobytes()
    float_wav.write_bytes(b"RIFF" + (36 + len(data)).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
                          + (3).to_bytes(2, "little") + (1).to_bytes(2, "little") + (16000).to_bytes(4, "little")
                          + (64000).to_bytes(4, "little") + (4).to_bytes(2, "little") + (32).to_bytes(2, "little")
                          + b"data" + len(data).to_bytes(4, "little") + data)
    for path, message in ((tmp_path / "missing.wav", "no such file"), (not_wav, "not a WAV file"),
                          (empty, "holds no samples"), (float_wav, "not a WAV file of integer PCM")):
        done = _run_transcribe(pte, str(path))
        assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_bad_settings_and_programs_are_refused_by_name(whisper, transcriber, tmp_path):
    samples = speech.speech_like(1.0)
    with pytest.raises(TranscriptionError, match="language='klingon': this model knows de, en, fr"):
        transcriber.transcribe(samples, language="klingon")
    with pytest.raises(TranscriptionError, match="max_new_tokens=999: expected 1 to 60"):
        transcriber.transcribe(samples, language="en", max_new_tokens=999)
    with pytest.raises(AudioError, match="NaN"):
        transcriber.transcribe(np.full(100, np.nan, dtype=np.float32))
    with pytest.raises(AudioError, match="mono samples"):
        transcriber.transcribe(np.zeros((2, 100), dtype=np.float32))
    mlp = tmp_path / "mlp.pte"
    etmlx.export(torch.nn.Linear(4, 4), (torch.zeros(1, 4),), mlp)
    with pytest.raises(TranscriptionError, match="not a speech program: it lacks audio_preprocessor"):
        Transcriber(etmlx.load(mlp), os.path.dirname(whisper[1]))


def test_export_refuses_what_does_not_apply_to_whisper(whisper, tmp_path):
    folder = whisper[0]
    with pytest.raises(etmlx.ExportError, match="kv_bits: a language model's option, which .* Whisper model does not take"):
        etmlx.export_llm(folder, tmp_path / "w.pte", kv_bits=4)
    with pytest.raises(etmlx.ExportError, match="a decoder cache of 100 tokens: expected 2 to the model's 64"):
        etmlx.export_llm(folder, tmp_path / "w.pte", max_context=100)
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in os.listdir(folder):
        if name != "preprocessor_config.json":
            os.symlink(os.path.join(folder, name), bare / name)
    with pytest.raises(etmlx.ExportError, match="has no preprocessor_config.json"):
        etmlx.export_llm(str(bare), tmp_path / "w.pte")
