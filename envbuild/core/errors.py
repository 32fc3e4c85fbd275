"""Errors a user can cause or meet; each carries its message and exit code."""

from __future__ import annotations

from envbuild.core.redact import redact

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NO_ENGINE = 3


class EnvbuildError(Exception):
    """Base of every error envbuild reports to a user."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str) -> None:
        # Every message a user sees passes through here: secrets never reach a report or a log.
        message = redact(message)
        super().__init__(message)
        self.message = message


class BadInput(EnvbuildError):
    """The user's input (options, matrix file, selection) cannot be used."""

    exit_code = EXIT_BAD_INPUT


class MatrixError(BadInput):
    """A matrix or knowledge file is broken; carries every problem found."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class SelectionError(BadInput):
    """A selection leaves no entry to work on."""


class EngineUnavailable(EnvbuildError):
    """The Docker engine cannot be reached."""

    exit_code = EXIT_NO_ENGINE


class EngineFailed(EngineUnavailable):
    """The engine answered a request with an error, too late, or with something that is not its
    API: as unusable as an engine that cannot be reached, and reported the same way."""


class BuildFailed(EnvbuildError):
    """An image build failed."""


class SmokeFailed(EnvbuildError):
    """A smoke test could not run or did not pass."""
