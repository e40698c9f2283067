"""The ``etmlx`` command: export, run, inspect, ops, build-native; export-llm, generate and
chat (``llm/cli.py``); serve (``serve/cli.py``); transcribe (``speech/cli.py``)."""

import argparse
import importlib.util
import json
import logging
import os
import sys

from . import progress
from .errors import EtMlxError
from .quant.weights import CHOICES


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="etmlx", description="Export PyTorch models to .pte files that run on MLX.")
    commands = parser.add_subparsers(dest="command", required=True)

    export = commands.add_parser("export", help="export FILE.py:FACTORY to a .pte")
    export.add_argument("factory", help="FILE.py:FACTORY; FACTORY() returns (module, example_inputs[, dynamic_shapes])")
    export.add_argument("-o", "--output", required=True, help="the .pte to write")
    export.add_argument("--report", action="store_true", help="print, per operator, what MLX took and why not")
    export.add_argument("--quantize", choices=CHOICES, help="quantize the weights of linear layers and "
                        "embeddings (torchao weight-only; mxfp4, mxfp8, nvfp4: MLX's float modes) to run on MLX's "
                        "quantized kernels")
    export.add_argument("--group-size", type=_group_size, default=64,
                        help="values per quantization group, a multiple of 32, or 'channel' for one per row "
                        "(default 64; mxfp4, mxfp8 and nvfp4 have their own: 32, 32, 16)")
    export.add_argument("--no-quantize-embeddings", dest="quantize_embeddings", action="store_false",
                        help="with --quantize: keep embeddings in float")
    export.add_argument("--tensor-parallel", type=_ranks, metavar="N",
                        help="shard attention and MLP weights over N processes of `mlx.launch -n N`: "
                             "-o names a directory of one .pte per rank")
    export.set_defaults(handler=_export)

    run = commands.add_parser("run", help="run a .pte on random inputs (or --inputs) and time it")
    run.add_argument("pte", help="a .pte, or a directory exported with --tensor-parallel (under mlx.launch)")
    run.add_argument("--method", default="forward")
    run.add_argument("--inputs", help=".npz whose arrays are the inputs, in the order saved (np.savez(f, a, b) or np.savez(f, x=a, y=b)), or one .npy")
    run.add_argument("--iterations", type=int, default=10, help="timed calls after one warm-up call")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--runtime", choices=("python", "executorch"), default="python",
                     help="etmlx's Python runtime, or ExecuTorch's C++ runtime with etmlx's native backend")
    run.set_defaults(handler=_run)

    inspect = commands.add_parser("inspect", help="show methods, MLX nodes, constants and outside kernels")
    inspect.add_argument("pte", help="a .pte, or a directory exported with --tensor-parallel")
    inspect.add_argument("--json", action="store_true", help="machine-readable output (lists every constant)")
    inspect.add_argument("--constants", action="store_true", help="list every constant, not only their count")
    inspect.set_defaults(handler=_inspect)

    ops = commands.add_parser("ops", help="which core ATen operators MLX computes (the support table)")
    ops.add_argument("--json", action="store_true", help="machine-readable output")
    ops.set_defaults(handler=_ops)

    from .llm.cli import add_commands
    from .serve.cli import add_command as add_serve
    from .speech.cli import add_command as add_transcribe

    add_commands(commands)
    add_serve(commands)
    add_transcribe(commands)

    build_native = commands.add_parser("build-native", help="build the native backend for ExecuTorch's C++ runtime "
                                       "(needs `pip install 'etmlx[native]'` and a C++20 compiler)")
    build_native.add_argument("--build-dir", help="default: build/native in a checkout, else a folder of the user's cache")
    build_native.add_argument("--sanitize", action="store_true", help="with AddressSanitizer and UBSan")
    build_native.set_defaults(handler=_build_native)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        return args.handler(args)
    except BrokenPipeError:  # the reader (head, less) went away: nothing went wrong here
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (EtMlxError, ValueError, RuntimeError, OSError, KeyError) as error:
        print(f"etmlx {args.command}: error: {_error_text(error)}", file=sys.stderr)
        return 1


def _error_text(error: Exception) -> str:
    """The line a user reads: an OSError as the file and its reason ("model.pte: No such
    file or directory"), not Python's "[Errno 2] ..." form."""
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename}: {error.strerror}" if error.filename else error.strerror
    return str(error)


def load_factory(spec: str):
    """Imports FILE.py and returns its FACTORY callable."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise EtMlxError(f"expected FILE.py:FACTORY, got {spec!r}")
    if not os.path.isfile(path):
        raise EtMlxError(f"no such file: {path}")
    module_spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        module_spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise EtMlxError(f"{path} has no callable {name!r}")
    return factory


def _ranks(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of ranks, 1 or more")
    return int(text)


def _group_size(text: str):
    if text == "channel":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of values or 'channel'") from None


def _export(args) -> int:
    from .exporter import export

    made = load_factory(args.factory)()
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise EtMlxError("the factory must return (module, example_inputs) or (module, example_inputs, dynamic_shapes)")
    module, inputs, dynamic_shapes = (*made, None) if len(made) == 2 else made
    with progress.shown(sys.stderr.isatty()):
        result = export(
            module, inputs, args.output, dynamic_shapes=dynamic_shapes, quantize=args.quantize,
            group_size=args.group_size, quantize_embeddings=args.quantize_embeddings, tensor_parallel=args.tensor_parallel,
        )
    if args.tensor_parallel:
        sizes = ", ".join(f"{os.path.basename(rank.path)} {rank.size_bytes} bytes" for rank in result.ranks)
        print(f"wrote {result.path}: {result.size} ranks ({sizes})")
        for decision in result.decisions:
            print(f"  {decision}")
    else:
        print(f"wrote {result.path} ({result.size_bytes} bytes)")
    if args.quantize:
        print(f"quantized to {args.quantize}: {len(result.quantized)} layer(s): {', '.join(result.quantized) or 'none'}")
        if not args.tensor_parallel:
            from .llm.cli import print_formats

            print_formats(result.formats)
    print(result.report.summary())
    if args.report:
        print(result.report.to_text())
    return 0


def _ops(args) -> int:
    from .support import format_text, summary, support_table

    rows = support_table()
    print(json.dumps({"operators": rows, "summary": summary(rows)}, indent=1) if args.json else format_text(rows))
    return 0


def _read_inputs(path: str) -> list:
    """The arrays of ``--inputs``: an .npz's in input order, or one .npy's array; one
    EtMlxError naming the file for anything else (numpy's own error for a text file
    speaks of pickled data)."""
    import zipfile

    import numpy as np

    if not os.path.isfile(path):
        raise EtMlxError(f"--inputs: {path}: no such file")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        raise EtMlxError(f"--inputs: {path} is not a NumPy .npz or .npy file of arrays") from None
    if isinstance(loaded, np.ndarray):
        return [loaded]
    with loaded as archive:
        return [archive[name] for name in _input_order(archive.files)]


def _input_order(names: list) -> list:
    """The arrays of an .npz in input order: ``np.savez(f, a, b)`` names them arr_0,
    arr_1, ...; ``np.savez(f, tokens=a, mask=b)`` keeps the order they were passed in."""
    numbered = [name for name in names if name.startswith("arr_") and name[4:].isdigit()]
    if numbered and len(numbered) != len(names):
        raise EtMlxError(f"--inputs: name every array or none (np.savez put them in the order {names})")
    return sorted(names, key=lambda name: int(name[4:])) if numbered else list(names)


def _random_inputs(method: dict, seed: int) -> list:
    import numpy as np

    rng = np.random.default_rng(seed)
    inputs = []
    for value in method["inputs"]:
        if value["kind"] != "tensor":
            raise EtMlxError(f"input of kind {value['kind']} cannot be made up; pass --inputs")
        shape, dtype = value["sizes"], value["dtype"]
        if dtype in ("float32", "float16"):
            inputs.append(rng.standard_normal(shape).astype(dtype))
        elif dtype == "bfloat16":
            import mlx.core as mx

            inputs.append(mx.array(rng.standard_normal(shape).astype("float32")).astype(mx.bfloat16))
        else:
            inputs.append(np.zeros(shape, dtype=dtype))  # zeros: valid as indices into anything
    return inputs


def _run(args) -> int:
    import numpy as np

    from . import load
    from .inspection import inspect_program
    from .runtime_shim.blas import preload_openblas
    from .parallel.ranks import is_tensor_parallel, rank_file
    from .timing import call_times

    program = load(args.pte, runtime=args.runtime)
    pte = rank_file(args.pte, program.rank) if is_tensor_parallel(args.pte) else args.pte
    if args.inputs:
        inputs = _read_inputs(args.inputs)
    else:
        method = inspect_program(pte)["methods"].get(args.method)
        if method is None:
            raise EtMlxError(f"{args.pte} has no method {args.method!r} (methods: {', '.join(program.method_names)})")
        inputs = _random_inputs(method, args.seed)
    outputs = program.run_method(args.method, inputs)
    times = call_times(program.run_method, args.method, inputs, warmup=0, repeat=args.iterations)
    for i, output in enumerate(outputs):
        shape = tuple(getattr(output, "shape", ()))
        print(f"output {i}: {getattr(output, 'dtype', type(output).__name__)} {shape}")
    if times:
        print(f"time per call: median {times[len(times) // 2] * 1e3:.3f} ms, min {times[0] * 1e3:.3f} ms "
              f"over {len(times)} calls")
    print(f"BLAS: {preload_openblas()}")
    return 0


def _inspect(args) -> int:
    from .inspection import format_text, inspect_program

    from .parallel.ranks import is_tensor_parallel, manifest, rank_file

    if is_tensor_parallel(args.pte):  # the ranks' programs differ only in their shards: rank 0 speaks for all
        shards = manifest(args.pte)
        report = {**inspect_program(rank_file(args.pte, 0)), "tensor_parallel": shards}
        if not args.json:
            print(f"tensor parallel over {shards['size']} ranks ({', '.join(shards['ranks'])}); rank 0:")
            print("\n".join(f"  {block}" for block in shards["blocks"]))
    else:
        report = inspect_program(args.pte)
    print(json.dumps(report, indent=2) if args.json else format_text(report, constants=args.constants))
    return 0


def _build_native(args) -> int:
    import pathlib

    from .native_build import build

    print(build(pathlib.Path(args.build_dir) if args.build_dir else None, args.sanitize))
    return 0


def run() -> None:
    """The ``etmlx`` command: ``main``'s exit status, without the interpreter's teardown,
    which frees torch's, transformers' and ExecuTorch's modules one by one for ~1.3 s after
    the work is done. Once ``main`` has returned every file it wrote is closed and renamed
    into place; the standard streams and logging are flushed here. An exception (Ctrl-C),
    or a profiler or tracer at work, ends the process as Python does."""
    status = main()
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(status)  # a profiler or coverage writes its data as the interpreter ends
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # a reader that went away (head): nothing left to give it
            pass
    os._exit(status)


if __name__ == "__main__":
    run()

