"""Errors that the command line turns into a one-line message instead of a traceback."""


class SpecrlError(Exception):
    """A user-facing error: the message says what was wrong and what to do."""


class InvalidRequestError(SpecrlError, ValueError):
    """An argument to the engine is out of range; the engine state is left unchanged."""


class SpecrlWarning(UserWarning):
    """A user-facing warning: the command line prints it as one ``specrl: warning:`` line."""
