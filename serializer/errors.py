"""Errors raised by the payload reader and writer."""

from etmlx.errors import EtMlxError


class PayloadError(EtMlxError, ValueError):
    """An etmlx delegate payload that cannot be read: truncated, corrupted, or newer."""
