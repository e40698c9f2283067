"""``etmlx transcribe PTE AUDIO.wav``: speech to text with a Whisper program from export-llm."""

import os
import sys


def add_command(commands) -> None:
    from etmlx.llm.cli import _positive

    transcribe = commands.add_parser("transcribe", help="transcribe a WAV file with a Whisper .pte from export-llm")
    transcribe.add_argument("pte", help="a .pte exported from a Whisper checkpoint")
    transcribe.add_argument("audio", help="a WAV file of integer PCM samples (any rate, any channels: resampled "
                            "to 16 kHz and mixed to mono)")
    transcribe.add_argument("--language", help="a language code or name (en, english); default: detected per "
                            "30 s window by a multilingual model")
    transcribe.add_argument("--task", choices=("transcribe", "translate"), help="translate: into English "
                            "(default: transcribe when a language is given, else as the model's config says)")
    transcribe.add_argument("--timestamps", action="store_true", help="print segments with their start and end times")
    transcribe.add_argument("--max-new-tokens", type=_positive, help="per 30 s window (default: as many as the "
                            "decoder's cache holds)")
    transcribe.add_argument("--runtime", choices=("python", "executorch"), default="python")
    transcribe.add_argument("--tokenizer", help="the folder of the tokenizer and generation_config.json "
                            "(default: the .pte's folder)")
    transcribe.set_defaults(handler=_transcribe)


def _transcribe(args) -> int:
    from etmlx import load
    from etmlx.llm.cli import _require_transformers
    from etmlx.speech.audio import read_wav
    from etmlx.speech.transcribe import Transcriber

    _require_transformers("transcribe")
    samples, rate = read_wav(args.audio)  # before the program loads: a bad file fails at once
    transcriber = Transcriber(load(args.pte, runtime=args.runtime),
                              args.tokenizer or os.path.dirname(os.path.abspath(args.pte)))
    transcript = transcriber.transcribe(samples, rate, language=args.language, task=args.task,
                                        timestamps=args.timestamps, max_new_tokens=args.max_new_tokens)
    if args.timestamps:
        for segment in transcript.segments:
            print(f"[{segment.start:6.2f} -> {segment.end:6.2f}] {segment.text}")
    else:
        print(transcript.text)
    if transcript.language:
        codes = sorted({token.strip("<|>") for token in transcript.language})
        print(f"language: {', '.join(codes)}", file=sys.stderr)
    return 0
