"""Data parallelism in PyTorch, taught by running it: the helpers every notebook and script uses.

Importing the package has no side effects: no threads, no seeding, no global settings.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`from dp_helpers import run_ddp` (and the other launch calls), imported only when first asked for."""
    if name in ("run_ddp", "run_json", "run_train", "DistributedRunError", "RunTimeoutError"):
        from dp_helpers.tool import launch

        return getattr(launch, name)
    raise AttributeError(f"module 'dp_helpers' has no attribute {name!r}")
