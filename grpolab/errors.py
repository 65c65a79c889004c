"""User-facing errors: the CLI prints their message on one line and exits non-zero, without a traceback."""


class GrpolabError(Exception):
    """Bad input or an unrecoverable run condition, with a message that names the field/row/file."""


class ConfigError(GrpolabError):
    """A config field is unknown, mistyped or out of range."""


class DataError(GrpolabError):
    """A data file is missing, unreadable or has malformed rows."""
