"""The one exception family of aotforge.

Every error a user can cause derives from :class:`AotforgeError`. Its message names the
cause and the fix; the CLI prints it as one line and exits with :attr:`exit_code`, one of
:data:`EXIT_CODES` (documented in ``aotforge --help`` and the README).
"""

from __future__ import annotations

#: A bug: an exception that is not an :class:`AotforgeError` (the CLI prints one line; --debug the traceback).
EXIT_INTERNAL = 1
#: The user's input: a model, option, input, name or registry reference that cannot work (click's usage errors too).
EXIT_USER = 2
#: The artifact does not reproduce the source model within tolerance, or a promotion gate failed.
EXIT_VALIDATION = 3
#: An artifact is not intact: a file's or the manifest's hash, or its signature, does not match.
EXIT_INTEGRITY = 4
#: The target (its SDK, device or a matching host) is not available here.
EXIT_TARGET_UNAVAILABLE = 5

#: A multi-target compile or a matrix finished with some of its builds failed (the others are written).
EXIT_PARTIAL = 6

#: Exit status -> what it means, in the order ``aotforge --help`` lists them.
EXIT_CODES: dict[int, str] = {
    0: "success",
    EXIT_INTERNAL: "internal error (a bug: rerun with --debug and report the traceback)",
    EXIT_USER: "user error (bad model, option, input, name or registry reference)",
    EXIT_VALIDATION: "validation failed (artifact vs source model) or a promotion gate failed",
    EXIT_INTEGRITY: "integrity or signature failure (a hash or signature does not match, not an artifact)",
    EXIT_TARGET_UNAVAILABLE: "target unavailable on this host (SDK, device, or built for another host)",
    EXIT_PARTIAL: "some builds of a multi-target compile or a matrix failed (the others finished)",
}


class AotforgeError(Exception):
    """Base of every user-facing aotforge error."""

    exit_code = EXIT_USER


class ModelLoadError(AotforgeError):
    """The source model file is missing, unreadable or not a valid model."""


class InputSpecError(AotforgeError):
    """The input description (names, shapes, dynamic dims, ranges) does not fit the model."""


class DraftMismatchError(InputSpecError):
    """A speculative-decoding draft artifact whose vocabulary or tokenizer differs from its target's."""


class OptionsError(AotforgeError):
    """An option, preset or recipe key is unknown or has a bad value."""


class PassFailedError(AotforgeError):
    """A graph pass failed or left an invalid graph."""


class TargetUnavailableError(AotforgeError):
    """The target cannot compile or run on this host (missing package or device)."""

    exit_code = EXIT_TARGET_UNAVAILABLE


class EngineBusyError(AotforgeError):
    """The serving engine's queue of waiting requests is full: retry after a while (the server's 429)."""


class RunnerError(AotforgeError):
    """A target's model runner failed on a step of generation (the message names the runner's error)."""


class RankFailedError(AotforgeError):
    """A rank of a tensor-parallel artifact died or failed: its requests fail, and the ranks are restarted."""


class UnsupportedModelError(AotforgeError):
    """The target cannot honour the model or a pass that ran on it."""


class CompileError(AotforgeError):
    """The target backend failed to compile the IR."""


class ValidationFailedError(AotforgeError):
    """The compiled artifact does not reproduce the source model within tolerance."""

    exit_code = EXIT_VALIDATION


class ArtifactError(AotforgeError):
    """An artifact is missing, incomplete, tampered with or built for another host."""

    exit_code = EXIT_INTEGRITY


class UnknownReferenceError(ArtifactError):
    """A user error about artifacts, not an integrity failure: a malformed or unknown name, version,
    registry reference or registry path, or a destination that already exists."""

    exit_code = EXIT_USER


class SignatureError(ArtifactError):
    """An artifact's signature is missing, malformed, made by another key or does not match its manifest."""


class HostMismatchError(ArtifactError):
    """An artifact was built for a host or toolchain this one does not match."""

    exit_code = EXIT_TARGET_UNAVAILABLE


def describe(e: BaseException, *, last: bool = False, limit: int = 300) -> str:
    """One line of a library's exception for our messages: its first (or last) non-empty line."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    if lines[0].startswith("[ONNXRuntimeError]"):
        # ORT puts the cause on the lines after its first ("... for the following indices" / "index: 1
        # Got: 3 Expected: 8"): all of them, joined, and no C++ stack (ORT's messages carry none).
        return "; ".join(lines)[:limit]
    return (lines[-1] if last else lines[0])[:limit]


class RegistryError(AotforgeError):
    """A registry is unreachable, answered with an error, or holds no such artifact."""


class PromotionRefusedError(RegistryError):
    """An alias was not moved because a promotion gate (validation, quality, latency) failed."""

    exit_code = EXIT_VALIDATION
