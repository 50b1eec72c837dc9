"""Argument checks of run_ddp: every mistake refused in one sentence before anything starts."""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from pathlib import Path

from dp_helpers.tool.checks import (
    MissingFileError,
    UsageError,
    check_int,
    check_positive_number,
    env_seconds,
)
from dp_helpers.tool.env import choose_launch, gpu_count, nccl_available


def resolve_target(script) -> list[str]:
    """A .py path -> [path]; a dotted module name -> ['-m', name]; anything else is refused in one sentence."""
    if not isinstance(script, (str, os.PathLike)):
        raise UsageError(f"script must be a path or a module name, got {type(script).__name__}.")
    text = os.fspath(script)
    path = Path(text).expanduser()
    if isinstance(script, os.PathLike) or text.endswith(".py") or os.sep in text or path.exists():
        if not path.exists():
            raise MissingFileError(f"script not found: {path.resolve()}")
        if not path.is_file() or path.suffix != ".py":
            raise UsageError(f"script must be a .py file, got {path.resolve()}.")
        return [str(path.resolve())]
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", text) or importlib.util.find_spec(text) is None:
        raise UsageError(f"no script file or importable module named {text!r}.")
    return ["-m", text]


def check_args(script_args, env, timeout) -> None:
    """Refuse script arguments, env and timeout of the wrong kind."""
    for arg in script_args:
        if isinstance(arg, bool) or not isinstance(arg, (str, int, float, os.PathLike)):
            raise UsageError(f"script arguments must be str, int, float or Path, got {arg!r}.")
    if env is not None and (not isinstance(env, Mapping) or
                            not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise UsageError("env must be a mapping of str to str.")
    if timeout is not None:  # None: no limit
        check_positive_number("timeout", timeout)
    check_env_numbers({**os.environ, **(env or {})})


ENV_SECONDS = ("DP_PG_TIMEOUT", "DP_PROBE_TIMEOUT")  # read by every rank: a bad value is refused here, before a start


def check_env_numbers(env: Mapping[str, str]) -> None:
    """Refuse a DP_* timeout in the environment that is not a positive number of seconds, naming the variable."""
    for name in ENV_SECONDS:
        env_seconds(name, 0, env)


def check_nodes(world_size: int, nnodes: int, node_rank: int, rdzv_endpoint: str | None) -> None:
    """Refuse an impossible node layout."""
    check_int("nnodes", nnodes, 1)
    check_int("node_rank", node_rank, 0)
    if node_rank >= nnodes:
        raise UsageError(f"node_rank must be < nnodes={nnodes}, got {node_rank}.")
    if world_size % nnodes:
        raise UsageError(f"world_size={world_size} must be a multiple of nnodes={nnodes} (same processes per node).")
    if nnodes > 1 and not (isinstance(rdzv_endpoint, str) and re.fullmatch(r"[^\s:]+:\d{1,5}", rdzv_endpoint)):
        raise UsageError(f"several nodes need rdzv_endpoint='host:port' of node 0, got {rdzv_endpoint!r}.")


def plan_world_size(world_size: int | None, backend: str) -> int:
    """The requested world size, checked; by default one process per GPU with >= 2 GPUs, else 2 CPU processes."""
    if world_size is None:
        world_size = 2 if backend == "gloo" else choose_launch(gpu_count(), nccl_available())[1]
    check_int("world_size", world_size, 1)
    return world_size


def check_echo(echo) -> None:
    """Refuse an echo that is not True, False or "all" (every line, tracebacks too: by default only their last line)."""
    if echo not in (True, False, "all") or isinstance(echo, (int, float)) and not isinstance(echo, bool):
        raise UsageError(f"echo must be True, False or 'all', got {echo!r}.")
