"""The one exception family of aotforge.

Every error a user can cause derives from :class:`AotforgeError`. Its message names the
cause and the fix; the CLI prints it as one line and exits with :attr:`exit_code`.
"""

from __future__ import annotations


class AotforgeError(Exception):
    """Base of every user-facing aotforge error."""

    exit_code = 2


class ModelLoadError(AotforgeError):
    """The source model file is missing, unreadable or not a valid model."""


class InputSpecError(AotforgeError):
    """The input description (names, shapes, dynamic dims, ranges) does not fit the model."""


class OptionsError(AotforgeError):
    """An option, preset or recipe key is unknown or has a bad value."""


class PassFailedError(AotforgeError):
    """A graph pass failed or left an invalid graph."""


class TargetUnavailableError(AotforgeError):
    """The target cannot compile or run on this host (missing package or device)."""


class UnsupportedModelError(AotforgeError):
    """The target cannot honour the model or a pass that ran on it."""


class CompileError(AotforgeError):
    """The target backend failed to compile the IR."""


class ValidationFailedError(AotforgeError):
    """The compiled artifact does not reproduce the source model within tolerance."""

    exit_code = 3


class ArtifactError(AotforgeError):
    """An artifact is missing, incomplete, tampered with or built for another host."""


class SignatureError(ArtifactError):
    """An artifact's signature is missing, malformed, made by another key or does not match its manifest."""


class HostMismatchError(ArtifactError):
    """An artifact was built for a host or toolchain this one does not match."""


def describe(e: BaseException, *, last: bool = False, limit: int = 300) -> str:
    """One line of a library's exception for our messages: its first (or last) non-empty line."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    return (lines[-1] if last else lines[0])[:limit]


class RegistryError(AotforgeError):
    """A registry is unreachable, answered with an error, or holds no such artifact."""


class PromotionRefusedError(RegistryError):
    """An alias was not moved because a promotion gate (validation, quality, latency) failed."""
