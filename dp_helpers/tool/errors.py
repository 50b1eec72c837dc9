"""The course's one error for bad input: raised by the request's checks, the launcher and the language switch.

It lives apart so that every module may raise it without importing the request's checks (tool/request.py
re-exports it, the name the notebooks and the README use).
"""


class UsageError(ValueError):
    """Bad input, refused in one sentence before anything starts; the CLI prints it without a traceback."""
