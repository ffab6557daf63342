"""One exception family for mistakes a user can fix.

The CLI prints these as a single line (no traceback) and exits with status 2.
Every message names the file, line or flag at fault and says what to do.
"""


class SesameError(Exception):
    """A user-facing error: bad input, bad flag, or a run directory of the wrong kind."""
