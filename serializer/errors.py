"""Errors raised by the payload reader and writer."""


class PayloadError(ValueError):
    """An etmlx delegate payload that cannot be read: truncated, corrupted, or newer."""
