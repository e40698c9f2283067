"""Exporting a real-size language model: ``etmlx export-llm`` against ``mlx_lm.convert`` on
the same checkpoint folder (random bfloat16 weights of a real model's shape, written by
bench/checkpoints.py), each in a fresh process, one after the other in this run, each
starting with the checkpoint out of the page cache: wall time,
peak resident memory (anonymous and file-backed pages alike, of the process tree: ``run``) and
what it wrote. A shape may name fewer layers (``llama-3.2-1b:8``): the peak of two depths
shows what grows with the model's depth.

    python bench/bench_export_llm.py                                   # 1B shape, 16 and 8 layers, int4
    python bench/bench_export_llm.py --shapes llama-3.1-8b --work /big/disk
    python bench/bench_export_llm.py --quantize none --dtype float32   # etmlx options as export-llm takes them
    python bench/bench_export_llm.py --gguf Q4_K                       # a GGUF file of each shape instead

With ``--gguf TYPE`` each shape is a GGUF file of TYPE blocks (bench/checkpoints.py
--gguf), which etmlx exports keeping its quantization; mlx-lm has no GGUF converter, so
the peak is set against the bound #37 asks for: 1.5x the file plus the output.
"""

import argparse
import glob
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

GIB = 2**30
# The commands as users run them: the console scripts beside this Python (``python -m
# etmlx.cli`` took a second or so longer than ``etmlx`` for the same export here, 2 cores;
# ``python -m mlx_lm convert`` as long as ``mlx_lm.convert``).
BIN = os.path.dirname(sys.executable)


def run(command: list) -> tuple:
    """(seconds, peak resident bytes) of ``command`` in a child process; its output is
    passed through; a failure ends the benchmark with the command named. The peak is the
    process tree's (etmlx quantizes in a worker process of its own): the child's own
    ``ru_maxrss``, or the sum of its processes' resident sizes sampled every 20 ms, which
    ever is larger."""
    start = time.perf_counter()
    child = subprocess.Popen(command)
    sampled, done = [0], threading.Event()
    sampler = threading.Thread(target=_sample_tree, args=(child.pid, sampled, done))
    sampler.start()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    if status:
        sys.exit(f"failed ({status}): {' '.join(command)}")
    return seconds, max(usage.ru_maxrss * 1024, sampled[0])  # kB on Linux


def _sample_tree(pid: int, peak: list, done) -> None:
    """The largest sum of resident bytes of ``pid`` and its descendants seen, into ``peak[0]``."""
    while not done.wait(0.02):
        peak[0] = max(peak[0], sum(_resident(p) for p in _tree(pid)))


def _tree(pid: int) -> list:
    found = [pid]
    for task in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(task) as f:
                found += [p for child in f.read().split() for p in _tree(int(child))]
        except OSError:  # it ended
            pass
    return found


def _resident(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def out_of_the_page_cache(directory: str) -> None:
    """Drops the checkpoint's files from the page cache (``POSIX_FADV_DONTNEED``: their
    clean pages), so that each tool reads them from the disk as the first did: run second,
    a tool would find what the first read still cached, as far as memory held it (at 8B, 16
    GB of files on this 24 GiB machine, it did not: which pages were left moved the 8B
    figures by half between runs)."""
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            descriptor = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(descriptor)


def size_of(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, name)) for name in os.listdir(path) if name.endswith(".safetensors"))


def checkpoint(work: str, spec: str) -> str:
    """The checkpoint folder of ``spec``, written by bench/checkpoints.py in a process of its
    own: a child's ru_maxrss starts from its parent's resident size at the fork, so this
    process stays small."""
    shape, _, layers = spec.partition(":")
    directory = os.path.join(work, spec.replace(":", "-"))
    if not os.path.isfile(os.path.join(directory, "model.safetensors.index.json")):
        print(f"writing {directory}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, os.path.join(HERE, "checkpoints.py"), shape, directory]
                       + (["--layers", layers] if layers else []), check=True)
    return directory


def gguf_file(work: str, spec: str, kind: str) -> str:
    """The GGUF file of ``spec`` with ``kind`` blocks, written (as ``checkpoint``) if missing."""
    shape, _, layers = spec.partition(":")
    path = os.path.join(work, f"{spec.replace(':', '-')}-{kind}.gguf")
    if not os.path.isfile(path):
        print(f"writing {path}", file=sys.stderr, flush=True)
        os.makedirs(work, exist_ok=True)
        subprocess.run([sys.executable, os.path.join(HERE, "checkpoints.py"), shape, path, "--gguf", kind]
                       + (["--layers", layers] if layers else []), check=True)
    return path


def export_ggufs(args) -> None:
    from etmlx.runtime_shim.blas import preload_openblas

    rows = []
    for spec in args.shapes:
        path = gguf_file(args.work, spec, args.gguf)
        pte = os.path.join(args.work, f"{spec.replace(':', '-')}-{args.gguf}.pte")
        command = [os.path.join(BIN, "etmlx"), "export-llm", path, "-o", pte, "--max-context",
                   str(args.max_context)] + (["--dtype", args.dtype] if args.dtype else [])
        seconds, peak = run(command)
        rows.append((spec, seconds, peak, os.path.getsize(path), os.path.getsize(pte)))
        os.remove(pte)
    print(f"\n{platform.machine()}, {os.cpu_count()} cores, BLAS: {preload_openblas()}; GGUF {args.gguf}, "
          f"etmlx dtype {args.dtype or 'float32 (the default for GGUF)'}")
    print(f"{'shape':<18}{'GGUF file':>11}{'time':>9}{'peak RSS':>11}{'output':>10}{'peak / (1.5 file + output)':>28}")
    for spec, seconds, peak, file_size, output in rows:
        print(f"{spec:<18}{file_size / GIB:>7.2f} GiB{seconds:>8.1f}s{peak / GIB:>8.2f} GiB{output / GIB:>6.2f} GiB"
              f"{peak / (1.5 * file_size + output):>27.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["llama-3.2-1b", "llama-3.2-1b:8"])
    parser.add_argument("--quantize", default="int4", help="int4, int8, ... or none")
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--dtype", help="etmlx's --dtype (default: the checkpoint's)")
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "etmlx-bench-export-llm"),
                        help="where the checkpoints (kept, reused) and the outputs go")
    parser.add_argument("--skip-mlx-lm", action="store_true")
    parser.add_argument("--gguf", metavar="TYPE", help="export a GGUF file of TYPE blocks (Q4_0, Q4_K, Q8_0, ...)")
    args = parser.parse_args()
    if args.gguf:
        return export_ggufs(args)
    from etmlx.runtime_shim.blas import preload_openblas

    quantize = None if args.quantize == "none" else args.quantize
    rows = []
    for spec in args.shapes:
        directory = checkpoint(args.work, spec)
        pte = os.path.join(args.work, f"{spec.replace(':', '-')}.pte")
        command = [os.path.join(BIN, "etmlx"), "export-llm", directory, "-o", pte,
                   "--max-context", str(args.max_context)]
        if quantize:
            command += ["--quantize", quantize, "--group-size", str(args.group_size)]
        if args.dtype:
            command += ["--dtype", args.dtype]
        out_of_the_page_cache(directory)
        seconds, peak = run(command)
        rows.append((spec, "etmlx export-llm", seconds, peak, size_of(pte)))
        os.remove(pte)
        if args.skip_mlx_lm:
            continue
        converted = os.path.join(args.work, f"{spec.replace(':', '-')}-mlx")
        subprocess.run(["rm", "-rf", converted], check=True)
        command = [os.path.join(BIN, "mlx_lm.convert"), "--hf-path", directory, "--mlx-path", converted]
        if quantize:
            command += ["-q", "--q-bits", quantize.removeprefix("int"), "--q-group-size", str(args.group_size)]
        out_of_the_page_cache(directory)
        seconds, peak = run(command)
        rows.append((spec, "mlx_lm.convert", seconds, peak, size_of(converted)))
        subprocess.run(["rm", "-rf", converted], check=True)

    print(f"\n{platform.machine()}, {os.cpu_count()} cores, BLAS: {preload_openblas()}; quantize {args.quantize}"
          f" (groups of {args.group_size}), etmlx dtype {args.dtype or 'the checkpoint'}")
    print(f"{'shape':<18}{'tool':<20}{'time':>9}{'peak RSS':>11}{'output':>10}{'time x':>8}{'peak x':>8}{'size x':>8}")
    reference = {spec: row for spec, tool, *row in rows if tool == "mlx_lm.convert"}
    for spec, tool, seconds, peak, size in rows:
        ratios = ""
        if spec in reference and tool != "mlx_lm.convert":
            base = reference[spec]
            ratios = f"{seconds / base[0]:>7.2f}x{peak / base[1]:>7.2f}x{size / base[2]:>7.3f}x"
        print(f"{spec:<18}{tool:<20}{seconds:>8.1f}s{peak / GIB:>8.2f} GiB{size / GIB:>6.2f} GiB{ratios}")


if __name__ == "__main__":
    main()
