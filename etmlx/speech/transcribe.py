"""Transcription with an exported Whisper program (``whisper_program``): per 30 s window,
the log-mel front end and the encoder run once, then greedy decoding from the prompt
transformers' ``generate`` builds, with transformers' own logits processors (suppressed
tokens, Whisper's timestamp rules), so a window's tokens are ``generate``'s.

Audio longer than a window is cut into consecutive 30 s windows, each transcribed as
``generate`` transcribes up to 30 s (transformers' long-form decoding instead computes the
features of the whole file at once and moves each window's start to the last timestamp
predicted, across window boundaries)."""

import os
from dataclasses import dataclass, field

import numpy as np

from etmlx.errors import EtMlxError

from .audio import AudioError, read_wav, resample

METHODS = ("audio_preprocessor", "audio_encoder", "text_decoder")
SECONDS_PER_TIMESTAMP = 0.02  # Whisper's timestamp tokens, 20 ms apart
FRAMES_PER_TIMESTAMP = 2  # of log-mel features: the encoder halves them


class TranscriptionError(EtMlxError, ValueError):
    """A transcription that cannot be made: not a speech program, an unknown language or
    task, settings out of range."""


@dataclass
class Segment:
    start: float  # seconds from the start of the audio
    end: float
    text: str


@dataclass
class Transcript:
    text: str
    language: list = field(default_factory=list)  # each window's language token, where the model has them
    segments: list = field(default_factory=list)  # with timestamps: Segments
    tokens: list = field(default_factory=list)  # each decoding pass's generated token ids (prompt and EOS excluded)


class Transcriber:
    """Transcribes with ``program`` (a loaded Whisper ``.pte``), its tokenizer and
    ``generation_config.json`` read from ``folder`` (export-llm copies them beside the file)."""

    def __init__(self, program, folder):
        from transformers import GenerationConfig

        from etmlx.llm.generation import load_tokenizer

        missing = [name for name in METHODS if name not in program.method_names]
        if missing:
            raise TranscriptionError(f"not a speech program: it lacks {', '.join(missing)} "
                                     "(export a Whisper checkpoint with `etmlx export-llm`)")
        self.program = program
        constant = {name: program.run_method(name, []) for name in
                    ("sample_rate", "window_samples", "get_max_context_len", "get_eos_ids")}
        self.sample_rate, self.window_samples = int(constant["sample_rate"][0]), int(constant["window_samples"][0])
        self.capacity, self.eos_ids = int(constant["get_max_context_len"][0]), {int(e) for e in constant["get_eos_ids"]}
        if not os.path.isfile(os.path.join(folder, "generation_config.json")):
            raise TranscriptionError(f"{folder} has no generation_config.json (export-llm copies it beside the .pte)")
        self.config = GenerationConfig.from_pretrained(folder)
        self.tokenizer = load_tokenizer(folder)

    def transcribe_file(self, path, **options) -> Transcript:
        samples, rate = read_wav(path)
        return self.transcribe(samples, rate, **options)

    def transcribe(self, samples, sample_rate: int = 16000, *, language=None, task=None, timestamps: bool = False,
                   max_new_tokens=None) -> Transcript:
        """``samples``: mono audio, floats in [-1, 1], at ``sample_rate`` (resampled to the
        model's). ``language`` (a code or a name; None: detected per window, on a
        multilingual model), ``task`` ("transcribe" or "translate"), ``timestamps`` and
        ``max_new_tokens`` (per decoding pass) as transformers' ``generate`` takes them."""
        import torch

        samples = np.asarray(samples, dtype=np.float32)
        if samples.ndim != 1 or samples.size == 0:
            raise AudioError(f"expected mono samples, one dimension and at least one value; got shape {samples.shape}")
        if not np.all(np.isfinite(samples)):
            raise AudioError("the samples hold NaN or infinite values")
        samples = resample(samples, sample_rate, self.sample_rate)
        transcript, kept = Transcript(text=""), []
        for start in range(0, samples.size, self.window_samples):
            window = np.zeros(self.window_samples, dtype=np.float32)
            chunk = samples[start:start + self.window_samples]
            window[:chunk.size] = chunk
            features = self.program.run_method("audio_preprocessor", [torch.from_numpy(window)])[0]  # torch, as given
            seconds = start / self.sample_rate
            for seek, tokens, complete in self._passes(features, language, task, timestamps, max_new_tokens,
                                                       transcript):
                transcript.tokens.append(tokens)
                kept += tokens[:complete]
                if timestamps:
                    offset = seconds + seek / features.shape[-1] * self.window_samples / self.sample_rate
                    transcript.segments += self._segments(tokens[:complete], offset)
        transcript.text = self.tokenizer.decode(kept, skip_special_tokens=True).strip()
        return transcript

    def _passes(self, features, language, task, timestamps, max_new_tokens, transcript):
        """Decoding passes over one window's features, as ``generate`` makes them: each
        encodes the features from frame ``seek`` on (zeros after them) and decodes; a pass
        whose last segment is unfinished (cut by ``max_new_tokens``) moves ``seek`` to that
        segment's start timestamp and decodes again from there. Yields ``(seek, tokens,
        how many of them end in finished segments)``."""
        import torch

        frames, seek, prompt = features.shape[-1], 0, None
        while seek < frames:
            shifted = torch.zeros_like(features)
            shifted[..., :frames - seek] = features[..., seek:]
            self.program.run_method("audio_encoder", [shifted])
            if prompt is None:  # once per window: the language is detected on its start
                prompt = self.prompt(language, task, timestamps)
                transcript.language += [self.tokenizer.convert_ids_to_tokens(t) for t in prompt[1:2]
                                        if t in self._language_ids()]
            tokens = self._greedy(prompt, timestamps, max_new_tokens)
            advance, complete = self._advance(tokens, frames - seek)
            yield seek, tokens, complete
            seek += advance

    def _advance(self, tokens: list, remaining: int) -> tuple:
        """(frames to move ``seek`` by, tokens before the unfinished segment): transformers'
        ``_retrieve_segment``. Two timestamps in a row end a segment; when the last one is
        not followed by a lone timestamp at the end, decoding resumes at its start."""
        first = getattr(self.config, "no_timestamps_token_id", None)
        if first is None:
            return remaining, len(tokens)
        stamp = [token > first for token in tokens]
        ends = [i + 1 for i in range(len(tokens) - 1) if stamp[i] and stamp[i + 1]]
        if not ends or stamp[-2:] == [False, True]:
            return remaining, len(tokens)
        last = ends[-1] + 1
        advance = (tokens[last - 2] - first - 1) * FRAMES_PER_TIMESTAMP
        return (advance if advance > 0 else remaining), last  # (a pair at 0.00 would decode the same pass again)

    def _greedy(self, prompt: list, timestamps: bool, max_new_tokens) -> list:
        import torch

        room = self.capacity - len(prompt)
        if max_new_tokens is None:
            max_new_tokens = room
        if not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= room:
            raise TranscriptionError(f"max_new_tokens={max_new_tokens!r}: expected 1 to {room} (the decoder's "
                                     f"{self.capacity} positions less the prompt's {len(prompt)})")
        processors = self._processors(len(prompt), timestamps)
        ids = torch.tensor([prompt])
        logits = self._decode(prompt, 0)
        generated = []
        while True:
            token = int(processors(ids, logits).argmax(-1))
            if token in self.eos_ids:
                return generated
            generated.append(token)
            if len(generated) == max_new_tokens:
                return generated
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
            logits = self._decode([token], ids.shape[1] - 1)

    def _decode(self, tokens: list, position: int):
        import torch

        logits = self.program.run_method("text_decoder", [torch.tensor([tokens]),
                                                          torch.arange(position, position + len(tokens))])[0]
        return logits.float()

    def prompt(self, language=None, task=None, timestamps: bool = False) -> list:
        """The decoder's first tokens, as ``generate`` builds them: the start token, the
        language (given, or detected here, on a multilingual model), the task,
        <|notimestamps|> unless ``timestamps``."""
        config = self.config
        tokens = [config.decoder_start_token_id]
        lang_to_id = getattr(config, "lang_to_id", None)
        if language is not None:
            tokens.append(self._language_id(language))
        elif lang_to_id:
            logits = self._decode(tokens, 0)[0]
            allowed = np.full(logits.shape[-1], False)
            allowed[list(lang_to_id.values())] = True
            tokens.append(int(np.argmax(np.where(allowed, logits.numpy(), -np.inf))))
        task_to_id = getattr(config, "task_to_id", None)
        if task is not None:
            if not task_to_id or task not in task_to_id:
                raise TranscriptionError(f"task={task!r}: this model knows {sorted(task_to_id or []) or 'no tasks'}")
            tokens.append(task_to_id[task])
        elif language is not None and task_to_id:
            tokens.append(task_to_id["transcribe"])
        no_timestamps = getattr(config, "no_timestamps_token_id", None)
        if not timestamps and no_timestamps is not None:
            tokens.append(no_timestamps)
        elif timestamps and no_timestamps is None:
            raise TranscriptionError("this model has no timestamp tokens (no no_timestamps_token_id)")
        return tokens

    def _language_ids(self) -> set:
        return set((getattr(self.config, "lang_to_id", None) or {}).values())

    def _language_id(self, language: str) -> int:
        from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE

        lang_to_id = getattr(self.config, "lang_to_id", None)
        if not lang_to_id:
            raise TranscriptionError(f"language={language!r}: this model is English-only (it has no language tokens)")
        name = language.lower()
        code = TO_LANGUAGE_CODE.get(name, name)
        for token in (name, f"<|{code}|>"):
            if token in lang_to_id:
                return lang_to_id[token]
        known = ", ".join(sorted(token.strip("<|>") for token in lang_to_id))
        raise TranscriptionError(f"language={language!r}: this model knows {known}")

    def _processors(self, begin_index: int, timestamps: bool):
        """transformers' logits processors, in the order ``generate`` applies them."""
        from transformers import LogitsProcessorList
        from transformers.generation.logits_process import (SuppressTokensAtBeginLogitsProcessor,
                                                            SuppressTokensLogitsProcessor,
                                                            WhisperTimeStampLogitsProcessor)

        config, processors = self.config, []
        if getattr(config, "begin_suppress_tokens", None):
            processors.append(SuppressTokensAtBeginLogitsProcessor(config.begin_suppress_tokens, begin_index))
        if getattr(config, "suppress_tokens", None):
            processors.append(SuppressTokensLogitsProcessor(config.suppress_tokens))
        if timestamps:
            processors.append(WhisperTimeStampLogitsProcessor(config, begin_index=begin_index))
        return LogitsProcessorList(processors)

    def _segments(self, tokens: list, offset: float) -> list:
        """Text between pairs of timestamp tokens, their times moved by ``offset`` seconds."""
        first = self.config.no_timestamps_token_id + 1
        segments, start, text = [], None, []
        for token in tokens:
            if token < first:
                text.append(token)
                continue
            time = offset + (token - first) * SECONDS_PER_TIMESTAMP
            if start is None:
                start = time
            else:
                segments.append(Segment(start, time, self.tokenizer.decode(text, skip_special_tokens=True).strip()))
                start, text = None, []
        return segments

