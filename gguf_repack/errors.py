"""The one exception family for bad input.

Every error a user can cause (a damaged file, a wrong path, an output in the way) is a
`RepackError`. The CLI prints it as one line, ``error: <message>``, and exits 2. Anything
else that escapes is a bug in gguf-repack and keeps its traceback.
"""


class RepackError(ValueError):
    """Bad input or an unusable output location; the message names the file and the fault."""


class FormatError(RepackError):
    """A GGUF file, or a gguf-repack output directory, that does not parse or is inconsistent."""


class OutputError(RepackError):
    """An output path that exists, cannot be written, or is not ours to replace."""


def one_line(e: BaseException) -> str:
    """The `error:` line's text for what a user can cause: a RepackError's message, or an
    OSError (disk full, permissions) as `file: reason`."""
    if isinstance(e, OSError):
        return f"{e.filename}: {e.strerror or e}" if e.filename else str(e.strerror or e)
    return str(e)
