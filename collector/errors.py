"""The one exception type that reaches the user.

Library code raises InferprobeError with a sentence a person can act on;
cli/main.py catches it once, prints the sentence and exits with exit_code.
Nothing below the CLI calls sys.exit.
"""


class InferprobeError(Exception):
    """A failure to report as one clear sentence and a non-zero exit."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class EnvironmentProblem(InferprobeError):
    """The host cannot trace: no BTF, no privileges, a kernel too old, no libbpf."""

    exit_code = 3


class TargetProblem(InferprobeError):
    """The target process is gone, not ours to trace, or not an HTTP server."""

    exit_code = 4


class RecordingProblem(InferprobeError):
    """A recording file is unreadable, corrupt or from a newer version."""

    exit_code = 5
