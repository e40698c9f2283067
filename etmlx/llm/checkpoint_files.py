"""How export-llm reads a checkpoint folder, for the causal-LM, speech and vision-language
exports alike: the model (safetensors checked, loaded in a dtype, refused when tensors are
missing), its processor, and the tokenizer files copied beside the ``.pte``."""

import glob
import os
import shutil

from etmlx.errors import ExportError, first_line

# What a tokenizer of a checkpoint folder is made of (whichever it has), and its chat template.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json", "generation_config.json")


def refuse_incomplete(model_dir, model_class: str, info: dict) -> None:
    """transformers fills a tensor the checkpoint lacks (or has in another shape) with
    random values and carries on: a model that computes garbage. Refused, by name."""
    missing = sorted(info.get("missing_keys") or ())
    mismatched = sorted(f"{key} (checkpoint {tuple(found)}, model {tuple(wanted)})"
                        for key, found, wanted in info.get("mismatched_keys") or ())
    for problem, names in (("lacks", missing), ("has other shapes for", mismatched)):
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            raise ExportError(f"{model_dir} {problem} {len(names)} tensor(s) {model_class} needs: {shown} "
                              "(transformers would fill them with random values)")


def copy_tokenizer(model_dir, destination, extra=()) -> list:
    """Copies the tokenizer files of ``model_dir`` (and the files named in ``extra``) into
    ``destination``; their names."""
    copied = []
    for name in TOKENIZER_FILES + tuple(extra):
        source = os.path.join(model_dir, name)
        if os.path.isfile(source):
            target = os.path.join(destination, name)
            if os.path.abspath(source) != os.path.abspath(target):
                shutil.copyfile(source, target)
            copied.append(name)
    return copied


def load_checkpoint(model_class, model_dir, dtype, kind: str, converted_when_read: bool = False):
    """``model_class.from_pretrained(model_dir)`` in eval mode, in ``dtype`` ("float32",
    ...; None: the checkpoint's own), after checking its safetensors files, and refused
    when it lacks tensors the model needs; ``kind`` names what it was read as in errors.

    The checkpoint's own dtype leaves its tensors in the files' memory maps. Another one
    converts the whole model as it loads, or, ``converted_when_read`` (inside
    ``lowering.deferred.scope()``), leaves them there too: each parameter a placeholder
    computed in ``dtype`` when read (``_converted``)."""
    import torch

    from . import safetensors_file

    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        safetensors_file.check(path)
    wanted = None if dtype is None else getattr(torch, dtype)
    in_place = wanted is None or converted_when_read
    model = _from_pretrained(model_class, model_dir, "auto" if in_place else wanted, kind)
    if wanted is not None and in_place:
        model = _converted(model, wanted) or _from_pretrained(model_class, model_dir, wanted, kind)
    return model.eval()


def _from_pretrained(model_class, model_dir, dtype, kind: str):
    try:
        model, info = model_class.from_pretrained(model_dir, dtype=dtype, output_loading_info=True)
    except (ValueError, OSError, KeyError) as error:
        raise ExportError(f"transformers cannot load {model_dir} as {kind}: {first_line(error)}") from error
    refuse_incomplete(model_dir, type(model).__name__, info)
    return model


def _converted(model, dtype):
    """``model`` (loaded in the checkpoint's dtype) as transformers loads it in ``dtype``:
    each floating parameter of another dtype a ``deferred.converted`` placeholder of its
    mapped one (buffers, small, converted now), from which transformers builds the model
    again, computing its non-persistent buffers in ``dtype`` (Gemma's embedding scale,
    which a bfloat16 load rounds) and tying what it ties. None where it made any tensor
    other than the ones it was given (a module it keeps in float32, say): loaded whole
    instead."""
    from etmlx.lowering import deferred

    parameters = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    state, made, converting = {}, {}, False  # made: a tensor's storage -> what stands for it
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tensor.shape)
        if key in made:
            continue  # tied to an earlier tensor (a head to its embedding): transformers ties it again
        if not tensor.is_floating_point() or tensor.dtype == dtype:
            made[key] = tensor
        else:  # buffers now: lowering shares parameters only (``edge_passes.share_weights_when_copied``)
            made[key] = deferred.converted(tensor, dtype) if name in parameters else tensor.to(dtype)
            converting = True
        state[name] = made[key]
    if not converting:
        return model
    given = {t.data_ptr() for t in state.values()}
    rebuilt, info = type(model).from_pretrained(None, config=model.config, state_dict=state, dtype=dtype,
                                                output_loading_info=True)
    kept = all(t.data_ptr() in given for t in rebuilt.state_dict().values())
    return rebuilt if kept and not any(info.values()) else None


def load_processor(processor_class, model_dir, what: str):
    """``processor_class.from_pretrained(model_dir)`` (a feature extractor, a processor),
    or one ExportError saying the folder's ``what`` cannot be read."""
    try:
        return processor_class.from_pretrained(model_dir)
    except (ValueError, OSError, KeyError) as error:
        raise ExportError(f"{model_dir}: transformers cannot read its {what}: {first_line(error)}") from error
