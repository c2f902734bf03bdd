"""One exception tree for the whole library; the CLI maps it to exit codes."""

from __future__ import annotations

from prism_rr.text import shown

__all__ = [
    "DivergenceError",
    "FormatError",
    "HangError",
    "PrismError",
    "RecorderError",
    "ReplayError",
    "UnsupportedVersionError",
    "UsageError",
    "exit_code_for",
]


class PrismError(Exception):
    """Base of every error prism-rr raises on purpose.

    Its message is one line for people, wherever it is shown: what it quotes of a bundle
    went through `prism_rr.text.shown` where it was quoted (cut to a length), and
    the message as a whole does here, so that a path or a value no one thought to quote
    still cannot draw on the terminal or break the line."""

    exit_code = 1

    def __str__(self) -> str:
        return shown(super().__str__(), None)


class UsageError(PrismError):
    """The user asked for something that cannot be done as asked."""

    exit_code = 2


class FormatError(PrismError):
    """A bundle or spool is malformed; the message names what and where."""

    exit_code = 4


class UnsupportedVersionError(FormatError):
    """A bundle written by a format version this reader does not support."""


class RecorderError(PrismError):
    """Recording could not start or finish."""


class ReplayError(PrismError):
    """Replay could not run."""


class DivergenceError(ReplayError):
    """A replayed rank did something other than what was recorded."""

    exit_code = 3


class HangError(ReplayError):
    """A replayed rank reached the end of a recorded hang: a call that a peer never joined
    in the recording, or the end of its program while a peer waits for a call it never made."""

    exit_code = 7


def exit_code_for(error: BaseException) -> int:
    """The process exit code for an error: see `prism-rr --help`."""
    if isinstance(error, PrismError):
        return error.exit_code
    return 1
