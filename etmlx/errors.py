"""The errors etmlx raises at its public surface."""


class EtMlxError(Exception):
    """Base class of every etmlx error."""


class ExportError(EtMlxError):
    """A model, its example inputs or its options cannot be exported."""
