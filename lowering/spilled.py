"""Constants kept in files until the program is written.

A lowered constant's bytes go into ExecuTorch's named data store and stay there until
the ``.pte`` is written: the whole output, held in memory on top of the export's own
working set. Inside ``files_beside(output)``, a large one is instead written to a file
in a temporary folder beside the output as soon as it is lowered, and stored as
ExecuTorch's ``FileBackedData``, which the store takes as it takes bytes and copies into
the program as it is written. The page cache holds those files meanwhile, which the
kernel writes back and reclaims as it needs, rather than the exporting process. The
folder is beside the output, not in ``/tmp``, which is often memory (tmpfs), and on the
output's filesystem, where the kernel copies a file without reading it through this
process (``copied_file``).
"""

import contextlib
import functools
import os
import tempfile

from etmlx.errors import ExportError

SPILLED_BYTES = 2**20  # smaller constants stay in memory

_folders = []  # the open blocks': (folder, {SHA-256: its file}), innermost last


@contextlib.contextmanager
def files_beside(output):
    """Inside the block, ``spilled`` keeps large constants in a temporary folder beside
    ``output`` (the path of the program to be written), removed with its files at the
    block's end: the program must be written inside it."""
    beside = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(beside):
        raise ExportError(f"{output}: no folder {beside} to write it in")
    with tempfile.TemporaryDirectory(prefix=".etmlx-constants-", dir=beside) as folder:
        _folders.append((folder, {}))
        try:
            yield
        finally:
            _folders.pop()


def spilled(data, sha256: bytes):
    """``data`` (bytes whose SHA-256 is ``sha256``) written to a file of the innermost
    ``files_beside`` folder, as a ``copied_file``, once for all its users (the methods
    of a program share weights); ``data`` itself outside such a block, where it is
    smaller than ``SPILLED_BYTES`` or not bytes, or where no file could be written (a
    full disk)."""
    if not _folders or not isinstance(data, bytes) or len(data) < SPILLED_BYTES:
        return data
    folder, files = _folders[-1]
    if sha256 not in files:
        descriptor, path = tempfile.mkstemp(suffix=".bin", dir=folder)
        try:
            with os.fdopen(descriptor, "wb") as f:
                f.write(data)
        except OSError:
            os.remove(path)
            return data
        files[sha256] = copied_file(path, sha256)
    return files[sha256]


def copied_file(path, sha256: bytes):
    """ExecuTorch's ``FileBackedData`` of ``path``, whose bytes' SHA-256 is ``sha256``
    (which ExecuTorch's store would otherwise compute by reading the file where two
    delegates store it), copied into the program by the kernel where it can
    (``copy_file_range``, Linux) rather than 8 MiB at a time through this process, and
    removed once copied, so that the disk holds the bytes once (a program is written
    once: its named data store keeps one buffer for the same bytes)."""
    return _copied_file_class()(path, sha256)


@functools.cache
def _copied_file_class():
    from executorch.exir._serialize._cord import FileBackedData

    class CopiedFile(FileBackedData):
        def __init__(self, path, sha256):
            super().__init__(path, sha256=sha256)
            self.path = path

        def write_to_file(self, outfile) -> None:
            self._copy(outfile)
            os.remove(self.path)

        def _copy(self, outfile) -> None:
            if not hasattr(os, "copy_file_range"):
                return super().write_to_file(outfile)
            outfile.flush()  # the copy goes where the file's position is
            left = len(self)
            with open(self.path, "rb") as f:
                while left:
                    try:
                        copied = os.copy_file_range(f.fileno(), outfile.fileno(), left)
                    except OSError:  # the kernel's refusal (another filesystem, say) comes before any byte
                        if left < len(self):
                            raise
                        return super().write_to_file(outfile)
                    if copied == 0:
                        raise OSError(f"{self.path} ended {left} bytes early")
                    left -= copied

    return CopiedFile
