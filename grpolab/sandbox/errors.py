"""The sandbox's own errors (this package imports nothing else of grpolab; the CLI prints them on one line)."""


class SandboxError(Exception):
    """The sandbox cannot run programs here, or was given bad limits; the message names the setup or the field."""


class SandboxConfigError(SandboxError, ValueError):
    """A sandbox limit is unknown, mistyped or out of range (reward.sandbox.*)."""
