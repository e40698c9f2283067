"""A bar on the terminal while an export lowers a program's nodes (for a real model, the
part that takes longest: each weight is quantized and packed as its node is lowered).
Off unless a caller turns it on (``shown``): the CLI does when stderr is a terminal, so a
log or a pipe gets no carriage returns."""

import contextlib
import sys
import time

_enabled = False
WIDTH = 30
INTERVAL = 0.1  # seconds between redraws


@contextlib.contextmanager
def shown(enabled: bool = True):
    """Bars drawn on stderr inside the block when ``enabled``."""
    global _enabled
    before, _enabled = _enabled, enabled
    try:
        yield
    finally:
        _enabled = before


class Bar:
    """``label [#####     ] done/total``, redrawn in place at most every ``INTERVAL``."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.done, self._drawn = label, max(total, 1), 0, 0.0

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if now - self._drawn >= INTERVAL or self.done >= self.total:
            self._drawn = now
            filled = WIDTH * min(self.done, self.total) // self.total
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{' ' * (WIDTH - filled)}] {self.done}/{self.total}")
            sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()


class _Quiet:
    def advance(self, count: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


@contextlib.contextmanager
def bar(label: str, total: int):
    """A ``Bar`` while bars are shown, else one that draws nothing."""
    drawn = Bar(label, total) if _enabled else _Quiet()
    try:
        yield drawn
    finally:
        drawn.close()
