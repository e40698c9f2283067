"""A second process that quantizes a checkpoint's weights while this one traces the model.

Exporting a language model is two kinds of work: tracing, decomposing and lowering its
graph, Python on one core, and quantizing its weights (scales, integers, packed words and
their hash), tensor arithmetic over every value of the checkpoint. One after the other, a
Llama-3.2-1B-shaped export waits ~4 s for the second on 2 cores. A thread cannot take it
over: the graph work holds the interpreter's lock, which the tensor work needs between
every operation (tried: both ran slower than one after the other).

``started()`` runs a worker process beside the export, which starts on the matrices of
the checkpoint's files before the model is even loaded (``_likely_weights``). ``submit``
names a weight to it by where it lies in a memory-mapped safetensors file
(``mapped_files``) and gives back placeholders of its integers, scales and zero points
(``lowering/deferred.py``), which the worker's results fill, and offers lowering the
packed words it stores. The worker computes them with this process's own functions
(``intx.quantized``, ``rules.quantized.packed_integers``) from the same bytes: the
program is the same, byte for byte. A weight the worker does not give back (it failed,
or was stopped) is computed here when it is read.
"""

import contextlib
import functools
import glob
import logging
import math
import os
import pickle
import subprocess
import sys
import tempfile
import threading

log = logging.getLogger("etmlx")
_running = []  # the worker of the export in progress, if any


# Checkpoints smaller than this are quantized faster than a worker starts (it imports torch).
WORTH_A_WORKER_BYTES = 512 * 2**20


@contextlib.contextmanager
def started(model_dir, scheme: str, group_size, dtype):
    """A worker for ``submit`` inside the block, where the safetensors files of
    ``model_dir`` hold ``WORTH_A_WORKER_BYTES`` or more (``ETMLX_PACK_WORKER=1``: always;
    ``0``: never). It starts on the weights the export will most likely quantize to
    ``scheme`` in ``dtype`` (None: the files' own) before the model is loaded
    (``_likely_weights``). This process keeps half the cores for its own tensor work
    meanwhile, the worker takes the rest. Stopped at the block's end."""
    import torch

    wanted = os.environ.get("ETMLX_PACK_WORKER")
    paths = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    worth_it = sum(map(os.path.getsize, paths)) >= WORTH_A_WORKER_BYTES
    if wanted == "0" or (wanted != "1" and not worth_it) or (os.cpu_count() or 1) < 2:
        yield
        return
    threads, own = torch.get_num_threads(), max(1, os.cpu_count() // 2)
    try:
        worker = _Worker(os.cpu_count() - own)
    except OSError as error:  # no interpreter to start (an embedded one): all of it here
        log.warning("etmlx: no packing worker (%s); the weights are packed here", error)
        yield
        return
    torch.set_num_threads(min(own, threads))  # one more thread than cores makes each parallel region wait
    _running.append(worker)
    try:
        for job in _likely_weights(paths, scheme, group_size, dtype):
            worker.send(job)
        yield
    finally:
        _running.remove(worker)
        worker.stop()
        torch.set_num_threads(threads)


def add_files(model, model_dir) -> None:
    """Tells the running worker (if any) where the safetensors files of ``model_dir``,
    which ``model`` was loaded from, lie in memory (``mapped_files``)."""
    if _running:
        _running[-1].files.update(mapped_files(model, model_dir))


def submit(weight, scheme: str, group_size):
    """(integers, scale, zero point) of ``weight`` quantized as ``intx.quantized`` quantizes
    it, placeholders whose values the running worker computes (the integers' packed words
    offered to lowering), or None: no worker, or ``weight`` not read from a mapped file."""
    from etmlx.lowering import deferred

    if not _running:
        return None
    worker = _running[-1]
    source = deferred.source(weight)
    where = worker.locate(source)
    if where is None:
        return None
    index = worker.send((*where, tuple(source.shape), _name(source.dtype), _name(weight.dtype), scheme, group_size))
    if index is None:
        return None
    return _placeholders(weight, scheme, group_size, lambda: worker.result(index))


def _placeholders(weight, scheme, group_size, result):
    """``submit``'s placeholders, filled from ``result()`` (the worker's answer, or None:
    then computed here as ``intx.quantized`` computes them)."""
    import torch

    from etmlx.lowering import deferred
    from etmlx.lowering.rules.quantized import packed_form

    from .intx import bits, quantized

    @functools.cache
    def here():  # where the worker gave nothing back: scales computed here, integers when read
        with torch.no_grad():
            return quantized(weight, scheme, group_size, deferred=True)

    def part(name: str, index: int):
        answer = result()
        return getattr(here(), name) if answer is None else answer[index]

    example = quantized(torch.zeros((1, weight.shape[1]), dtype=weight.dtype), scheme, group_size, deferred=False)
    rows = weight.shape[0]
    scale = deferred.placeholder((rows, *example.scale.shape[1:]), example.scale.dtype, lambda: part("scale", 0))
    zero_point = deferred.placeholder((rows, *example.zero_point.shape[1:]), example.zero_point.dtype,
                                      lambda: part("zero_point", 1))
    integers = deferred.placeholder(weight.shape, torch.int8, lambda: deferred.resolve(here().qdata))
    deferred.offer(integers, packed_form(bits(scheme)), lambda: None if result() is None else result()[2])
    return integers, scale, zero_point


class _Worker:
    """The worker process, and a thread that takes its answers as they come. An answer
    names files in a private directory that hold the values (``_written``): the scales
    and zero points are read when lowering wants them, each in one call (bytes down a
    pipe came 64 KiB a read, the thread taking the interpreter's lock back after each
    from the tracing one); the packed words stay there until the program is written
    (``_read``), so this process never holds them. The directory goes when the worker
    is stopped, after the export has written its file.

    Each job is done by whichever process claims it first (``_claimed``): the worker takes
    them in order; this process, once its graph is built and it waits for an answer,
    takes the one it waits for if the worker has not, else the last one not taken, so
    that both use their cores to the end (an 8B model's weights outlast the graph work)."""

    def __init__(self, threads: int):
        self.files = {}  # path -> (address, size) of its memory map here
        self._log = tempfile.TemporaryFile()
        self._directory = tempfile.TemporaryDirectory(prefix="etmlx-packed-")
        self._process = subprocess.Popen([sys.executable, "-m", __name__, str(threads), self._directory.name],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        self._jobs, self._answers, self._ended = {}, {}, False  # job -> index; index -> its file's layout
        self._read = {}  # index -> (scale, zero point, packed words), read or computed here
        self._taken = set()  # the jobs the worker claimed before this process could
        self._arrived = threading.Condition()
        threading.Thread(target=self._receive, name="etmlx-pack-worker", daemon=True).start()

    def locate(self, tensor):
        """(path, offset) of a contiguous ``tensor`` inside a mapped file, else None."""
        if not tensor.is_contiguous() or tensor.device.type != "cpu":
            return None
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        for path, (address, size) in self.files.items():
            if address <= start and end <= address + size:
                return path, start - address
        return None

    def send(self, job: tuple):
        """The index of ``job`` (path, offset, shape, dtype, the dtype wanted, scheme,
        group size), sent now unless it was before; None where the worker no longer takes
        any."""
        if job in self._jobs:
            return self._jobs[job]
        try:
            pickle.dump((len(self._jobs), *job), self._process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self._process.stdin.flush()
        except (OSError, ValueError):  # it ended (a closed pipe)
            return None
        self._jobs[job] = len(self._jobs)
        return self._jobs[job]

    def result(self, index: int):
        """The (scale, zero point, packed words: a ``Stored``) of job ``index``: the
        worker's once they came, or computed here while waiting; None where the worker
        will not answer."""
        while index not in self._read and not self._answered(index) and self._do_one_here(index):
            pass
        if index not in self._read:
            with self._arrived:
                self._arrived.wait_for(lambda: index in self._answers or self._ended)
            if index not in self._answers:
                return None
            self._read[index] = _read(os.path.join(self._directory.name, str(index)), self._answers[index])
        return self._read[index]

    def _answered(self, index: int) -> bool:
        with self._arrived:
            return index in self._answers or self._ended

    def _do_one_here(self, wanted: int) -> bool:
        """Computes job ``wanted`` here if the worker has not claimed it, else the last
        job neither has; whether there was one."""
        jobs = {index: job for job, index in self._jobs.items()}
        for index in [wanted, *sorted(jobs, reverse=True)]:
            if index in self._read or index in self._taken or self._answered(index):
                continue
            if _claimed(self._directory.name, index):
                try:
                    self._read[index] = _quantized(*jobs[index])
                except (OSError, ValueError):  # its file cannot be read so: from the tensor, as without a worker
                    self._read[index] = None
                return True
            self._taken.add(index)
        return False

    def _receive(self) -> None:
        try:
            while True:
                index, layout = pickle.load(self._process.stdout)
                with self._arrived:
                    self._answers[index] = layout
                    self._arrived.notify_all()
        except (EOFError, OSError, ValueError, pickle.UnpicklingError):
            pass
        finally:
            with self._arrived:
                self._ended = True
                self._arrived.notify_all()

    def stop(self) -> None:
        """Ends the worker; says why in the log where it ended by itself before answering."""
        with self._arrived:
            failed = self._ended and len(self._answers) + len(self._read) < len(self._jobs)
        with contextlib.suppress(OSError):
            self._process.stdin.close()
        self._process.kill()
        self._process.wait()
        if failed:
            self._log.seek(0)
            lines = self._log.read().decode(errors="replace").strip().splitlines()
            log.warning("etmlx: the packing worker stopped (%s); its weights were packed here",
                        lines[-1] if lines else f"exit status {self._process.returncode}")
        self._log.close()
        self._directory.cleanup()


def _likely_weights(paths, scheme: str, group_size, dtype) -> list:
    """Jobs for the matrices in the safetensors files ``paths`` whose rows divide into
    groups, in the order the layers come (``model.layers.2`` before ``model.layers.10``):
    the weights a language model's linear layers and embeddings quantize. The worker
    starts on them before the model is loaded; a matrix the model does not quantize so
    costs the worker its time, and nothing else. None for a mixed recipe, whose widths
    depend on the layers."""
    import re

    from etmlx.llm import safetensors_file

    from .intx import SCHEMES

    if scheme not in SCHEMES:
        return []
    floating = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
    found = []
    for path in paths:
        start = safetensors_file.data_start(path)
        for name, entry in safetensors_file.check(path).items():
            shape = entry.get("shape", []) if name != "__metadata__" else []
            if len(shape) == 2 and entry["dtype"] in floating and shape[1] % (group_size or shape[1]) == 0:
                stored_as = floating[entry["dtype"]]
                order = [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
                found.append((order, (path, start + entry["data_offsets"][0], tuple(shape), stored_as,
                                      dtype or stored_as, scheme, group_size)))
    return [job for _, job in sorted(found, key=lambda item: item[0])]  # text and numbers alternate in each key


def mapped_files(model, model_dir) -> dict:
    """``{path: (address, size)}`` of each safetensors file in ``model_dir`` whose memory
    map ``model``'s tensors (or the sources of its converted ones) are views of: every
    tensor named as in the file, of its size, must lie at the same distance from the
    file's bytes, or the file is left out."""
    from etmlx.llm import safetensors_file
    from etmlx.lowering import deferred

    tensors = {name: deferred.source(tensor) for name, tensor in model.state_dict().items()}
    found = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        start = safetensors_file.data_start(path)
        bases = set()
        for name, entry in safetensors_file.check(path).items():
            tensor = tensors.get(name) if name != "__metadata__" else None
            begin, end = entry["data_offsets"] if tensor is not None else (0, 0)
            if tensor is not None and tensor.is_contiguous() and tensor.numel() * tensor.element_size() == end - begin:
                bases.add(tensor.data_ptr() - start - begin)
        if len(bases) == 1:
            found[path] = (bases.pop(), os.path.getsize(path))
    return found


def _quantized(path, offset, shape, dtype, wanted, scheme, group_size) -> tuple:
    """(scale, zero point, packed words: a ``Stored``) of the weight at ``offset`` in
    ``path``, read in ``wanted``, as ``_placeholders`` would compute them here."""
    import numpy as np
    import torch

    from etmlx.lowering import deferred
    from etmlx.lowering.rules.quantized import packed_integers

    from .intx import bits, quantized

    source_dtype = getattr(torch, dtype)
    count = int(np.prod(shape)) * source_dtype.itemsize
    mapped = np.memmap(path, dtype=np.uint8, mode="c", offset=offset, shape=(count,))  # as safetensors maps it
    source = torch.from_numpy(mapped).view(source_dtype).reshape(shape)
    with deferred.scope(), torch.no_grad():
        weight = source if dtype == wanted else deferred.converted(source, getattr(torch, wanted))
        quantized = quantized(weight, scheme, group_size, deferred=False)
    return quantized.scale, quantized.zero_point, packed_integers(quantized.qdata, bits(scheme))


def _written(path, scale, zero_point, packed) -> tuple:
    """Writes a job's packed words into the file ``path``.packed, its scales and zero
    points into ``path``.parts; returns what ``_read`` needs of them besides."""
    from etmlx.lowering.dtypes import tensor_bytes

    with open(f"{path}.packed", "wb") as f:
        f.write(packed.data)
    with open(f"{path}.parts", "wb") as f:
        for tensor in (scale, zero_point):
            f.write(tensor_bytes(tensor))
    return (packed.sha256, packed.dtype, packed.shape), [(_name(t.dtype), tuple(t.shape)) for t in (scale, zero_point)]


def _read(path, layout) -> tuple:
    """(scale, zero point, ``Stored`` packed words) from the files ``_written`` wrote: the
    scales and zero points read (each in one call), the packed words left in their file
    (``lowering.spilled.copied_file``), which the program copies as it is written."""
    import torch

    from etmlx.lowering.context import Stored
    from etmlx.lowering.spilled import copied_file

    (sha256, ir_dtype, shape), tensors = layout
    values = []
    with open(f"{path}.parts", "rb") as f:
        for dtype, dims in tensors:
            raw = bytearray(getattr(torch, dtype).itemsize * math.prod(dims))
            f.readinto(raw)
            values.append(torch.frombuffer(raw, dtype=torch.uint8).view(getattr(torch, dtype)).reshape(dims))
    return *values, Stored(copied_file(f"{path}.packed", sha256), sha256, ir_dtype, shape)


def _claimed(directory: str, index: int) -> bool:
    """Claims job ``index`` for the calling process: False where the other has."""
    try:
        os.close(os.open(os.path.join(directory, f"{index}.claimed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _serve(threads: int, directory: str) -> None:
    """The worker: jobs from stdin; each one's results into a file of ``directory`` named
    by its index, then their layout to stdout; until stdin ends."""
    import torch

    torch.set_num_threads(threads)
    jobs, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but answers goes down their pipe
    while True:
        try:
            index, *job = pickle.load(jobs)
        except EOFError:
            return
        if not _claimed(directory, index):
            continue  # the exporting process does it
        layout = _written(os.path.join(directory, str(index)), *_quantized(*job))
        pickle.dump((index, layout), answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), sys.argv[2])
