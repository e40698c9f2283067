"""The errors etmlx raises at its public surface."""


def first_line(error: BaseException) -> str:
    """An exception's message in one line (its first), or its type's name when it has none:
    how a third-party error is quoted inside an etmlx one."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class EtMlxError(Exception):
    """Base class of every etmlx error."""


class ExportError(EtMlxError):
    """A model, its example inputs or its options cannot be exported."""
