"""``etmlx export-llm``: a Hugging Face checkpoint (a folder, or a Hub id) or a GGUF file to
a ``.pte`` that ExecuTorch's LLM runner and ``etmlx generate`` drive (``etmlx.llm.causal_lm``),
with the tokenizer files beside it."""

import contextlib
import os
import time

from etmlx.errors import ExportError, first_line
from etmlx.multimodal import export as multimodal_export
from etmlx.pipeline import fewer_collections
from etmlx.speech import export as speech_export

from . import causal_lm, gguf_model
from .draft import methods as draft_methods, refuse_recurrent
from .first_layers import first_layers
from .allocator import large_blocks_apart
from .checkpoint_files import TOKENIZER_FILES, copy_tokenizer

DEFAULT_MAX_CONTEXT = 2048
DTYPES = ("float32", "bfloat16", "float16")
# Class names of the checkpoints export-llm takes beyond transformers' causal-LM mapping
# (multimodal models whose text decoder is the causal LM).
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


@fewer_collections()  # the vision and speech programs' traces too
def export_llm(model_dir, output, *, max_context=None, max_seq_len: int = 128, quantize=None, group_size=64,
               dtype=None, sample_on_device: bool = False, kv_bits=None, kv_group_size: int = 64,
               verify: bool = False, draft=None, draft_layers=None, image_size=None, progress=None):
    """Exports the causal LM in ``model_dir`` (a checkpoint folder, a Hugging Face Hub id,
    ``checkpoint_folder``, or a ``.gguf`` file, its quantized weights kept as they are:
    ``gguf_model``) to ``output``; returns the ExportResult, whose ``quantized`` names
    each quantized layer and ``formats`` the format it runs in. A Whisper folder is
    exported by ``etmlx.speech.export``, a vision-language one (LLaVA) by
    ``etmlx.multimodal.export``.

    ``max_context``: the KV cache's capacity in tokens (default: the model's
    ``max_position_embeddings``, at most 2048); ``max_seq_len``: the most tokens one call
    takes (longer prompts are prefilled in chunks); ``quantize``: a width ("int4") or a
    recipe ("mixed_4_6"), as ``etmlx.export`` takes them, per ``group_size``; ``dtype``:
    of the weights and activations (default: the checkpoint's, read in place from its
    memory-mapped files; a GGUF file's: float32); ``sample_on_device``: also a ``sample`` method; ``kv_bits``
    (4 or 8): a quantized KV cache, in groups of ``kv_group_size``; ``verify``: also a ``verify``
    method, every position's logits, for speculative decoding (``causal_lm.export_methods``).
    ``draft`` (a checkpoint folder of the same tokenizer) or ``draft_layers`` (N: the
    model's own first N layers and head): a draft written into the same file, for
    speculative decoding from one file (``etmlx.llm.draft``; implies ``verify``).
    ``image_size`` (one side, or (height, width), in pixels): the most pixels (its area) of
    an image a Qwen2-VL, Qwen2.5-VL or Qwen3-VL export takes, each at its own shape
    (``etmlx.multimodal.qwen_processor``).
    ``progress(stage, seconds)`` is told of each stage as it ends.

    On Linux with glibc, exporting a GGUF file changes the process's mmap threshold
    (``allocator``): 4 MiB while it exports, 32 MiB after."""
    from etmlx.lowering import deferred
    from etmlx.quant import pack_worker
    from etmlx.quant.weights import INTEGER_SCHEMES

    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"dtype={dtype!r}: expected one of {', '.join(DTYPES)}")
    folder = None if gguf_model.is_gguf(model_dir) else checkpoint_folder(model_dir)
    speech, vision = folder and speech_export.is_whisper(folder), folder and multimodal_export.is_image_text(folder)
    if speech or vision:
        language_options = {"sample_on_device": sample_on_device, "kv_bits": kv_bits, "verify": verify,
                            "draft": draft, "draft_layers": draft_layers}
        for option, value in {**language_options, **({"image_size": image_size} if speech else {})}.items():
            if value:
                raise ExportError(f"{option}: a language model's option, which {folder}'s "
                                  f"{'Whisper' if speech else 'vision-language'} model does not take")
        common = dict(max_context=max_context, quantize=quantize, group_size=group_size, dtype=dtype, progress=progress)
        if speech:
            return speech_export.export_whisper(folder, output, **common)
        with deferred.scope():
            return multimodal_export.export_image_text(folder, output, max_seq_len=max_seq_len, image_size=image_size,
                                                       **common)
    if image_size is not None:
        raise ExportError("image_size: a vision-language model's option, which a language model does not take")
    if draft is not None and draft_layers is not None:
        raise ExportError("draft and draft_layers: a draft is another checkpoint or the model's own first layers, "
                          "not both")
    decoding = large_blocks_apart() if gguf_model.is_gguf(model_dir) else contextlib.nullcontext()
    packing = pack_worker.started(folder, quantize, group_size, dtype) if quantize in INTEGER_SCHEMES and folder \
        else contextlib.nullcontext()
    with deferred.scope(), decoding, packing:  # quantized weights' integers are computed as they are packed
        methods = dict(sample_on_device=sample_on_device, kv_bits=kv_bits, kv_group_size=kv_group_size,
                       verify=verify or draft is not None or draft_layers is not None)
        return _export_llm(model_dir, output, max_context, max_seq_len, quantize, group_size, dtype, methods,
                           (draft, draft_layers), progress or (lambda stage, seconds: None))


def _export_llm(model_dir, output, max_context, max_seq_len, quantize, group_size, dtype, method_options: dict,
                drafting: tuple, report):
    import torch

    from etmlx.exporter import export_methods

    started = time.perf_counter()
    formats, declined, tokenizer = {}, {}, None
    if gguf_model.is_gguf(model_dir):
        if quantize is not None:
            raise ExportError(f"quantize={quantize!r} with a GGUF file: its own quantization is kept (drop --quantize)")
        loaded = gguf_model.load(model_dir, getattr(torch, dtype or "float32"), deferred=True)
        model, tokenizer, formats, declined = loaded.model, loaded.tokenizer, loaded.formats, loaded.declined
    else:
        model_dir = checkpoint_folder(model_dir)
        model = _load(model_dir, dtype)
    capacity = max_context or min(getattr(model.config, "max_position_embeddings", None) or DEFAULT_MAX_CONTEXT,
                                  DEFAULT_MAX_CONTEXT)
    if not isinstance(capacity, int) or capacity < 1:
        raise ExportError(f"max_context={max_context!r}: expected a number of tokens, 1 or more")
    causal_lm.with_static_cache(model, capacity)
    report("load", time.perf_counter() - started)
    quantized = tuple(formats)
    if quantize is not None:
        from etmlx.quant.weights import formats as formats_of, quantize as quantize_weights

        started = time.perf_counter()
        model, quantized = quantize_weights(model, quantize, group_size, deferred=True)  # the model is ours
        formats = formats_of(model, quantized)
        report("quantize", time.perf_counter() - started)  # scales; the integers as they are packed
    draft_model = _draft_model(model, model_dir, dtype, quantize, group_size, *drafting, report)
    started = time.perf_counter()
    methods = causal_lm.export_methods(model, min(max_seq_len, capacity), capacity, **method_options)
    if draft_model is not None:
        methods.update(draft_methods(causal_lm.with_static_cache(draft_model, capacity), min(max_seq_len, capacity),
                                     capacity))
    report("trace", time.perf_counter() - started)
    started = time.perf_counter()
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    result = export_methods(methods, output)
    result.quantized, result.formats, result.declined = tuple(quantized), formats, declined
    report("lower and write", time.perf_counter() - started)
    destination = os.path.dirname(os.path.abspath(output))
    result.tokenizer_files = copy_tokenizer(model_dir, destination) if tokenizer is None \
        else _saved_tokenizer(tokenizer, destination)
    return result


def _draft_model(model, model_dir, dtype, quantize, group_size, draft_dir, draft_layers, report):
    """The draft to write beside ``model``: its own first ``draft_layers`` layers, or the
    causal LM of ``draft_dir`` (loaded and quantized as the model was, its tokenizer the
    model's); None for neither."""
    if draft_dir is None and draft_layers is None:
        return None
    refuse_recurrent(model, "target")
    if draft_layers is not None:
        return first_layers(model, draft_layers)
    started = time.perf_counter()
    draft_dir = checkpoint_folder(draft_dir)
    _refuse_another_tokenizer(model_dir, draft_dir)
    drafting = _load(draft_dir, dtype)
    vocab = (model.config.get_text_config().vocab_size, drafting.config.get_text_config().vocab_size)
    if vocab[0] != vocab[1]:
        raise ExportError(f"{draft_dir}: a vocabulary of {vocab[1]} tokens, not the target's {vocab[0]}: a draft must "
                          "share the target's tokenizer")
    if quantize is not None:
        from etmlx.quant.weights import quantize as quantize_weights

        drafting, _ = quantize_weights(drafting, quantize, group_size, deferred=True)
    report("load draft", time.perf_counter() - started)
    return drafting


def _refuse_another_tokenizer(model_dir, draft_dir) -> None:
    files = [os.path.join(folder, "tokenizer.json") for folder in (model_dir, draft_dir)]
    if all(os.path.isfile(f) for f in files):
        with open(files[0], "rb") as target, open(files[1], "rb") as other:
            if target.read() != other.read():
                raise ExportError(f"{files[1]} is not the target's tokenizer ({files[0]}): a draft must share it")


# What export-llm fetches of a Hub repository: config, safetensors weights, tokenizer files.
HUB_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja"]


def checkpoint_folder(model) -> str:
    """``model`` itself when it is a path that exists; else a Hugging Face Hub id
    (``org/name``), whose config, weights and tokenizer files are found in the Hub's
    cache or downloaded into it (``HF_HUB_OFFLINE=1``: the cache only)."""
    model = os.fspath(model)
    if os.path.exists(model):
        return model
    if model.count("/") != 1 or model.startswith((".", "/", "~")) or not all(model.split("/")):
        raise ExportError(f"{model}: no such directory (a Hugging Face checkpoint folder, or a Hub id: org/name)")
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(model, allow_patterns=HUB_FILES)
    except (OSError, ValueError) as error:  # not on the Hub, offline without a cached copy, no network
        raise ExportError(f"{model}: no such directory, and the Hugging Face Hub gave no copy of it: "
                          f"{first_line(error)}") from error


def _load(model_dir, dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    from etmlx.quant import pack_worker

    from .checkpoint_files import load_checkpoint

    if os.path.isfile(model_dir):
        raise ExportError(f"{model_dir} is a file: export-llm takes a Hugging Face checkpoint folder (config.json, "
                          "weights, tokenizer) or a .gguf file")
    if not os.path.isdir(model_dir):
        raise ExportError(f"{model_dir}: no such directory (a Hugging Face checkpoint folder: config.json, weights, tokenizer)")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ExportError(f"{model_dir} has no config.json: not a Hugging Face checkpoint folder")
    try:
        config = AutoConfig.from_pretrained(model_dir)  # an unknown model_type fails here, by name
    except (ValueError, OSError, KeyError) as error:
        raise ExportError(f"transformers cannot load {model_dir} as a causal LM: {first_line(error)}") from error
    _refuse_other_than_causal_lm(model_dir, config)
    causal_lm.refuse_recurrent_layers(config)
    model = load_checkpoint(AutoModelForCausalLM, model_dir, dtype, "a causal LM", converted_when_read=True)
    pack_worker.add_files(model, model_dir)  # where a worker quantizes its weights, it reads them from there
    return model


def _refuse_other_than_causal_lm(model_dir, config) -> None:
    """A checkpoint saved from an encoder or a headless model (``BertModel``,
    ``BertForMaskedLM``, ``LlamaModel``) is no causal LM, though transformers would load
    some of them as one (BERT as ``BertLMHeadModel``, its head random): refused by the
    classes config.json names, before any weight is read."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    saved_as = getattr(config, "architectures", None) or []
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    if saved_as and not any(name in causal or name.endswith(CAUSAL_LM_SUFFIXES) for name in saved_as):
        raise ExportError(f"{model_dir}: a {config.model_type} checkpoint saved as {', '.join(saved_as)}, not a causal "
                          "language model; export-llm takes decoder-only causal LMs (a *ForCausalLM checkpoint)")


def _saved_tokenizer(tokenizer, destination) -> list:
    """``tokenizer`` (read from a GGUF file's metadata) saved into ``destination``: the
    names of the files written."""
    return sorted(os.path.basename(name) for name in tokenizer.save_pretrained(destination)
                  if os.path.basename(name) in TOKENIZER_FILES)
