"""Input checks shared by the CLI, the launcher and the benchmark: one error type, one sentence each (torch-free)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping


class UsageError(ValueError):
    """Bad input, refused in one sentence before anything starts; the CLI prints it without a traceback."""


class MissingFileError(UsageError, FileNotFoundError):
    """A file the request names does not exist: a UsageError that `except FileNotFoundError` also catches."""


def check_int(name: str, value, minimum: int) -> None:
    """Refuse a value that is not a real int (bools too) or is below minimum."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} must be an int, got {value!r} ({type(value).__name__}).")
    if value < minimum:
        raise UsageError(f"{name} must be >= {minimum}, got {value}.")
    if value >= 2**63:  # torch keeps its integers (a seed, a size) in 64 bits
        raise UsageError(f"{name} must be below 2**63 (a 64-bit integer), got {value}.")


def check_positive_number(name: str, value) -> None:
    """Refuse a value that is not a finite number > 0 (NaN and inf too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{name} must be a number, got {value!r} ({type(value).__name__}).")
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{name} must be a finite number > 0, got {value}.")


def check_choice(name: str, value, choices) -> None:
    """Refuse a value that is not one of choices."""
    if value not in choices:
        raise UsageError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}.")


def env_seconds(name: str, default: float, env: Mapping[str, str] | None = None) -> float:
    """A timeout in seconds from the environment (default when unset); anything but a positive number is refused."""
    raw = (os.environ if env is None else env).get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{name}={raw!r} in the environment: it must be a positive number of seconds; "
                         "unset it for the default.")
    return value
