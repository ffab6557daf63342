"""One exception family for mistakes a user can fix, and warnings for what they should know.

The CLI prints these as a single line (no traceback) and exits with status 2.
Every message names the file, line or flag at fault and says what to do.
"""
import sys


class SesameError(Exception):
    """A user-facing error: bad input, bad flag, or a run directory of the wrong kind."""


def warn(message: str) -> None:
    """Something that runs but may not mean what the user thinks: one line on stderr, like the CLI's errors."""
    print(f"sesame: warning: {message}", file=sys.stderr, flush=True)
