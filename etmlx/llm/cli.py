"""The language-model commands of ``etmlx``: ``export-llm``, ``generate`` and ``chat``.
Generated text goes to stdout as it is made; statistics and progress go to stderr."""

import argparse
import os
import sys
from collections import Counter

from etmlx import progress
from etmlx.errors import EtMlxError
from etmlx.quant.weights import CHOICES
from etmlx.serializer.constants import QUANTIZED_CACHE_BITS


def add_commands(commands) -> None:
    export = commands.add_parser("export-llm", help="export a Hugging Face causal LM folder or a GGUF file to a .pte "
                                 "(ExecuTorch's LLM-runner convention; the tokenizer is copied beside it); also a "
                                 "Whisper folder (etmlx transcribe) or a vision-language one: LLaVA, Idefics3, "
                                 "SmolVLM, Gemma 3, Qwen2-VL, Qwen2.5-VL, Qwen3-VL (generate --image)")
    export.add_argument("model", help="a checkpoint folder (config.json, safetensors, tokenizer files), a Hugging "
                        "Face Hub id (org/name), found in the Hub's cache or downloaded into it, or a .gguf file "
                        "(its quantized weights kept: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K where exact)")
    export.add_argument("-o", "--output", required=True, help="the .pte to write")
    export.add_argument("--max-context", type=_positive, help="KV-cache capacity in tokens "
                        "(default: the model's max_position_embeddings, at most 2048)")
    export.add_argument("--max-seq-len", type=_positive, default=128,
                        help="most tokens per call: longer prompts are prefilled in chunks of this many (default 128)")
    export.add_argument("--quantize", choices=CHOICES, help="weight-only quantization (MLX's quantized kernels; "
                        "--group-size does not apply to mxfp4, mxfp8 and nvfp4)")
    export.add_argument("--group-size", type=_positive, default=64, help="values per quantization group (default 64)")
    export.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="of the weights and "
                        "activations (default: the checkpoint's, read in place; a GGUF file's: float32)")
    export.add_argument("--kv-bits", type=int, choices=QUANTIZED_CACHE_BITS, help="quantize the KV cache to this many "
                        "bits (full-attention layers; mx.quantize's affine layout, as mlx-lm's --kv-bits)")
    export.add_argument("--kv-group-size", type=_positive, default=64, help="values of a head per KV-cache "
                        "quantization group: 32, 64 or 128 (default 64)")
    export.add_argument("--sample-on-device", action="store_true", help="also write a `sample` method that draws "
                        "the next token inside the MLX delegate (generate and chat use it when sampling)")
    export.add_argument("--verify", action="store_true", help="also write a `verify` method that returns every "
                        "position's logits: the target of speculative decoding (generate and chat --draft)")
    drafts = export.add_mutually_exclusive_group()
    drafts.add_argument("--draft", metavar="DIR", help="also write this checkpoint (a smaller model of the same "
                        "tokenizer) into the file as the draft of speculative decoding (generate and chat "
                        "--speculative); implies --verify")
    drafts.add_argument("--draft-layers", type=_positive, metavar="N", help="also write a draft of the model's own "
                        "first N layers and head (its weights stored once), for generate and chat --speculative; "
                        "implies --verify")
    export.add_argument("--image-size", type=_image_size, metavar="SIDE|HxW", help="the most pixels of an image, "
                        "as an area, for a Qwen2-VL, Qwen2.5-VL or Qwen3-VL export: each image keeps its own shape "
                        "within it (default: 448x448 within the processor's bounds)")
    export.set_defaults(handler=_export_llm)

    for name, helps in (("generate", "generate text from a prompt"), ("chat", "a conversation on stdin, "
                        "with the tokenizer's chat template; the KV cache carries across turns (/reset starts over; "
                        "/image PATH: the next message is about that image, for a vision-language .pte; "
                        "/quit or end of input ends it)")):
        command = commands.add_parser(name, help=helps)
        command.add_argument("pte", help="a .pte from export-llm")
        if name == "generate":
            command.add_argument("--prompt", required=True)
            command.add_argument("--image", action="append", help="an image the prompt is about (a .pte of a "
                                 "vision-language model; repeatable): one user turn [images, prompt] in the "
                                 "processor's chat template")
            command.add_argument("--stop", action="append", default=[], help="a string that ends the text (repeatable)")
        else:
            command.add_argument("--system", help="a system message to start the conversation with")
            command.add_argument("--prompt-cache", metavar="FILE", help="continue the conversation saved in FILE "
                                 "(its KV cache restored: nothing is prefilled again) and save it there after each "
                                 "turn; FILE is made by the first turn when it does not exist")
        add_draft_options(command)
        command.add_argument("--max-new-tokens", type=_positive, default=128)
        command.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default)")
        command.add_argument("--top-k", type=int, default=0)
        command.add_argument("--top-p", type=float, default=1.0)
        command.add_argument("--min-p", type=float, default=0.0)
        command.add_argument("--repetition-penalty", type=float, default=1.0)
        command.add_argument("--seed", type=int)
        command.add_argument("--runtime", choices=("python", "executorch"), default="python")
        command.add_argument("--tokenizer", help="tokenizer.json or its folder (default: the .pte's folder)")
        command.set_defaults(handler=_generate if name == "generate" else _chat)


def add_draft_options(command, note: str = "") -> None:
    """``--draft``, ``--speculative`` and ``--num-draft-tokens`` (speculative decoding) of ``command``."""
    drafts = command.add_mutually_exclusive_group()
    drafts.add_argument("--draft", metavar="DRAFT.pte", help="decode speculatively: a smaller model of the same "
                        "tokenizer proposes tokens that this one (exported with --verify) checks in one call; the "
                        "text is the same as without, greedy or sampled" + note)
    drafts.add_argument("--speculative", action="store_true", help="decode speculatively with the draft written "
                        "into this .pte (export-llm --draft or --draft-layers)" + note)
    command.add_argument("--num-draft-tokens", type=_positive, default=4,
                         help="tokens the draft proposes per check (default 4)")


def draft_session(pte, target, draft_pte=None, speculative: bool = False, runtime: str = "python",
                  tokenizer_folder=None):
    """The draft of speculative decoding for the ``target`` session of ``pte``: the one
    written into that file (``speculative``), over the same loaded program, or the model of
    ``draft_pte`` (its tokenizer checked against ``tokenizer_folder``'s) on the same
    ``runtime``; None for neither."""
    from etmlx import load
    from .draft import PREFIX
    from .generation import GenerationError, Session

    if speculative:
        if f"{PREFIX}_forward" not in target.program.method_names:
            raise GenerationError(f"--speculative: {pte} holds no draft: export it with export-llm --draft DIR or "
                                  "--draft-layers N")
        return Session(target.program, prefix=PREFIX)
    if draft_pte is None:
        return None
    check_draft_tokenizer(tokenizer_folder or os.path.dirname(os.path.abspath(pte)), draft_pte)
    return Session(load(draft_pte, runtime=runtime))


def print_formats(formats: dict) -> None:
    """How many quantized layers run in each format (``ExportResult.formats``)."""
    for runs_as, count in sorted(Counter(formats.values()).items()):
        print(f"{count} layer(s) run {runs_as}")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number, 1 or more")
    return int(text)


def _image_size(text: str):
    """``448`` -> 448, ``448x672`` -> (448, 672)."""
    sides = text.lower().split("x")
    if len(sides) > 2 or not all(side.isdigit() and int(side) > 0 for side in sides):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a side or HEIGHTxWIDTH in pixels, such as 448 or 448x672")
    return int(sides[0]) if len(sides) == 1 else (int(sides[0]), int(sides[1]))


def _progress(stage: str, seconds: float) -> None:
    print(f"{stage}: {seconds:.1f} s", file=sys.stderr, flush=True)


def _require_transformers(command: str) -> None:
    """One line, not a traceback, for a pip install without the ``llm`` extra."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        raise EtMlxError(f"{command} needs transformers, which is not installed: pip install 'etmlx[llm]'")


def _export_llm(args) -> int:
    from .export import export_llm

    _require_transformers("export-llm")
    with progress.shown(sys.stderr.isatty()):
        result = export_llm(args.model, args.output, max_context=args.max_context, max_seq_len=args.max_seq_len,
                            quantize=args.quantize, group_size=args.group_size, dtype=args.dtype,
                            sample_on_device=args.sample_on_device, kv_bits=args.kv_bits,
                            kv_group_size=args.kv_group_size, verify=args.verify, draft=args.draft,
                            draft_layers=args.draft_layers, image_size=args.image_size, progress=_progress)
    print(f"wrote {result.path} ({result.size_bytes} bytes); {result.report.summary()}")
    if args.quantize:
        print(f"quantized to {args.quantize}: {len(result.quantized)} layer(s)")
    print_formats(result.formats)
    if args.kv_bits:
        print(f"KV cache quantized to {args.kv_bits} bits, groups of {args.kv_group_size}")
    for tensor, reason in result.declined.items():
        print(f"{tensor}: {reason}")
    if result.tokenizer_files:
        print(f"copied {', '.join(result.tokenizer_files)} beside it")
    else:
        print(f"warning: {args.model} has no tokenizer files; pass --tokenizer to generate and chat", file=sys.stderr)
    return 0


def _session(args):
    from etmlx import load
    from .generation import Sampling, Session, load_tokenizer

    _require_transformers(args.command)
    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.min_p, args.repetition_penalty, args.seed)
    session = Session(load(args.pte, runtime=args.runtime))
    _note_half_precision_on_the_cpu(args.pte)
    return session, load_tokenizer(_folder(args)), sampling


def _folder(args) -> str:
    """Where the program's tokenizer (and processor) lie: ``--tokenizer``, or beside it."""
    return args.tokenizer or os.path.dirname(os.path.abspath(args.pte))


def _note_half_precision_on_the_cpu(path) -> None:
    """A program that computes in bfloat16 or float16 (export-llm's default for such a
    checkpoint: fast on a Mac's GPU) runs several times slower on MLX's CPU kernels than
    in float32; said once, before the first token, so a slow start has its reason."""
    import mlx.core as mx

    from etmlx.inspection import buffer_dtypes

    if mx.default_device() != mx.cpu:
        return
    half = buffer_dtypes(path) & {"bfloat16", "float16"}  # its caches' (the logits are float32)
    if half:
        print(f"note: this program computes in {half.pop()}, which MLX's CPU kernels run several times slower than "
              "float32: for the CPU, export with --dtype float32", file=sys.stderr)


def _generate(args) -> int:
    from .generation import GenerationError, Stats, generate, stream_text

    if args.image and (args.draft or args.speculative):
        raise GenerationError("--draft or --speculative with --image: speculative decoding takes text prompts only")
    images = [_read_image(path) for path in args.image or []]  # before the program loads: a bad file fails at once
    session, tokenizer, sampling = _session(args)
    draft = draft_session(args.pte, session, args.draft, args.speculative, args.runtime, args.tokenizer)
    stats = Stats()
    if images:
        pieces = _image_turn(args, images, session, tokenizer, sampling, stats)
    elif draft is not None:
        from .speculative import speculative_decode

        steps = speculative_decode(session, draft, tokenizer.encode(args.prompt), args.max_new_tokens, sampling,
                                   args.num_draft_tokens, stats)
        pieces = stream_text(tokenizer, (step.token for step in steps), tuple(args.stop), stats, session.eos_ids)
    else:
        pieces = generate(session, tokenizer, args.prompt, args.max_new_tokens, sampling, tuple(args.stop), stats)
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    print(stats.summary(), file=sys.stderr)
    return 0


def _read_image(path):
    import importlib.util

    from etmlx.multimodal.images import read_image

    if importlib.util.find_spec("PIL") is None:
        raise EtMlxError("--image needs Pillow, which is not installed: pip install 'etmlx[llm]'")
    return read_image(path)


def _image_turn(args, images, session, tokenizer, sampling, stats):
    """The text after one user turn [``images``, ``args.prompt``], as it is made."""
    from etmlx.multimodal.images import PromptImages, image_prompt
    from .generation import generate_tokens, stream_text

    ids, pixel_values = image_prompt(_folder(args), args.prompt, images)
    session.images = PromptImages(session.program, pixel_values, ids)
    tokens = generate_tokens(session, ids, args.max_new_tokens, sampling, stats)
    return stream_text(tokenizer, tokens, tuple(args.stop), stats, session.eos_ids)


def check_draft_tokenizer(tokenizer_folder, draft_pte) -> None:
    """Refuses a draft whose folder holds another ``tokenizer.json`` than the target's."""
    from .generation import GenerationError

    files = [os.path.join(tokenizer_folder, "tokenizer.json"),
             os.path.join(os.path.dirname(os.path.abspath(draft_pte)), "tokenizer.json")]
    if all(os.path.isfile(f) for f in files) and _read(files[0]) != _read(files[1]):
        raise GenerationError(f"{files[1]} is not the target's tokenizer ({files[0]}): a draft must share it")


def _read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _chat(args) -> int:
    from etmlx.multimodal.images import processor_for
    from .chat import Chat

    session, tokenizer, sampling = _session(args)
    draft = draft_session(args.pte, session, args.draft, args.speculative, args.runtime, args.tokenizer)
    chat = Chat(session, tokenizer, sampling, args.max_new_tokens, system=args.system, draft=draft,
                num_draft_tokens=args.num_draft_tokens, processor=processor_for(session.program, _folder(args)))
    if args.prompt_cache and os.path.exists(args.prompt_cache):
        chat.restore(args.prompt_cache)
        print(f"(continuing {args.prompt_cache}: {len(chat.cached)} tokens held)", file=sys.stderr)
    interactive, image = sys.stdin.isatty(), None
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return 0
        text = line.strip()
        if text in ("/quit", "/exit"):
            return 0
        if text == "/reset":
            chat.reset()
            print("(conversation reset)", file=sys.stderr)
            continue
        if text.startswith("/image "):
            try:
                image = _read_image(text[len("/image "):].strip())
            except EtMlxError as error:
                print(f"etmlx chat: {error}", file=sys.stderr)
                continue
            print("(the image goes with your next message)", file=sys.stderr)
            continue
        if not text:
            continue
        try:
            for piece in chat.reply(text, image):
                sys.stdout.write(piece)
                sys.stdout.flush()
        except EtMlxError as error:
            print(f"\netmlx chat: {error}", file=sys.stderr)
            return 1
        image = None
        sys.stdout.write("\n")
        print(chat.stats.summary(), file=sys.stderr)
        if args.prompt_cache:
            chat.save(args.prompt_cache)


