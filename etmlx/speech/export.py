"""``etmlx export-llm`` of a Whisper checkpoint folder: one ``.pte`` (``whisper_program``)
with the tokenizer, generation config and preprocessor config copied beside it."""

import json
import os
import time

from etmlx.errors import ExportError

SPEECH_FILES = ("preprocessor_config.json",)


def is_whisper(model_dir) -> bool:
    """Whether ``model_dir`` is a checkpoint folder whose config.json names a Whisper model."""
    path = os.path.join(os.fspath(model_dir), "config.json")
    try:
        with open(path) as f:
            return json.load(f).get("model_type") == "whisper"
    except (OSError, ValueError, AttributeError):
        return False


def export_whisper(model_dir, output, *, max_context=None, quantize=None, group_size=64, dtype=None, progress=None):
    """Exports the Whisper model in ``model_dir`` to ``output``; ``max_context``: the
    decoder's KV cache in tokens (default: the model's ``max_target_positions``);
    ``quantize``/``group_size``: weight-only quantization of the linear layers, as
    ``etmlx.export`` takes them; ``dtype``: of the weights and activations (default: the
    checkpoint's; the log-mel front end computes in float32 always). Returns the ExportResult."""
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    from etmlx.exporter import export_methods
    from etmlx.llm.checkpoint_files import copy_tokenizer, load_checkpoint, load_processor

    from . import whisper_program

    report = progress or (lambda stage, seconds: None)
    started = time.perf_counter()
    if not os.path.isfile(os.path.join(model_dir, "preprocessor_config.json")):
        raise ExportError(f"{model_dir} has no preprocessor_config.json: the log-mel settings (mel bins, window) "
                          "of its feature extractor are needed")
    extractor = load_processor(WhisperFeatureExtractor, model_dir, "Whisper feature extractor")
    model = load_checkpoint(WhisperForConditionalGeneration, model_dir, dtype, "Whisper")
    if extractor.feature_size != model.config.num_mel_bins:
        raise ExportError(f"{model_dir}: its feature extractor makes {extractor.feature_size} mel bins, the model "
                          f"takes {model.config.num_mel_bins}")
    report("load", time.perf_counter() - started)
    quantized = ()
    if quantize is not None:
        from etmlx.quant.weights import quantize as quantize_weights

        model, quantized = quantize_weights(model, quantize, group_size, embeddings=False)
    started = time.perf_counter()
    capacity = max_context or model.config.max_target_positions
    try:
        methods = whisper_program.export_methods(model, extractor, capacity)
    except ValueError as error:
        raise ExportError(f"max_context={max_context}: {error}") from error
    report("trace", time.perf_counter() - started)
    started = time.perf_counter()
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    result = export_methods(methods, output)
    result.quantized = tuple(quantized)
    report("lower and write", time.perf_counter() - started)
    result.tokenizer_files = copy_tokenizer(model_dir, os.path.dirname(os.path.abspath(output)),
                                            extra=SPEECH_FILES)
    return result
