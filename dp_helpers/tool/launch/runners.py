"""Convenience runners the notebooks and tests use: the training job, and a script that leaves JSON behind."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from dp_helpers.tool.launch.diagnose import DistributedRunError, RunTimeoutError
from dp_helpers.tool.launch.process import signals_held
from dp_helpers.tool.launch.run import RunResult, run_ddp


def run_train(world_size: int, echo: bool = False, out_dir=None, timeout: float = 600, max_restarts: int = 0,
              **changes) -> tuple[RunResult, dict]:
    """The training job with some TrainConfig fields changed; returns the run and its final (unwrapped) weights."""
    import torch

    from dp_helpers.tool.config import TrainConfig
    from dp_helpers.tool.request import check_train_request

    cfg = TrainConfig(**changes)
    check_train_request(cfg, world_size, max_restarts=max_restarts, out_dir=out_dir, timeout=timeout)  # one sentence
    with ending_recorded(cfg, f"timeout {timeout:g} s" if timeout else ""):
        run = run_ddp("dp_helpers.scripts.train", *cfg.as_args(), world_size=world_size, echo=echo,
                      out_dir=out_dir, timeout=timeout, max_restarts=max_restarts)
    return run, torch.load(run.run_dir / "model.pt", map_location="cpu", weights_only=True)


@contextlib.contextmanager
def ending_recorded(cfg, timeout_reason: str, interrupted=lambda exc: "interrupted"):
    """Around a train launch: summary.json says how a run that did not finish ended (timed out, failed, interrupted)."""
    from dp_helpers.tool.runs import checkpoint_lock, file_stamp

    stamp = file_stamp(cfg.checkpoint) if cfg.checkpoint else None  # a snapshot an earlier run left there is not this run's
    before = (stamp, resumed_from(cfg))  # read now: this run may write its snapshots over the file it resumes
    try:
        with checkpoint_lock(cfg.checkpoint) if cfg.checkpoint else contextlib.nullcontext():  # one writer a snapshot
            yield
    except RunTimeoutError as exc:
        ended(exc, cfg, before, timeout_reason)
        raise
    except DistributedRunError as exc:
        ended(exc, cfg, before, str(exc).splitlines()[0], "failed", failed_ranks=list(exc.ranks))
        raise
    except KeyboardInterrupt as exc:  # the launcher put the run folder on it
        ended(exc, cfg, before, interrupted(exc))
        raise
    except OSError as exc:  # the launcher's own writes (console.log): a full disk, say
        ended(exc, cfg, before, f"{type(exc).__name__}: {exc}", "failed")
        raise


def ended(exc: BaseException, cfg, before: tuple, reason: str, status: str = "stopped", **more) -> None:
    """Record how the run ended and remove what a killed write left half done (a second Ctrl-C waits meanwhile)."""
    from dp_helpers.tool.files import remove_partials
    from dp_helpers.tool.runs import record_ending

    run_dir, world_size = getattr(exc, "run_dir", None), getattr(exc, "world_size", None)
    stamp, resumed = before
    with signals_held(), contextlib.suppress(OSError):  # a full disk must not hide the error that stopped the run
        remove_partials(cfg.checkpoint, *((Path(run_dir) / name for name in ("model.pt", "summary.json"))
                                          if run_dir else ()))
        record_ending(run_dir, cfg, reason, status, stamp, world_size, getattr(exc, "backend", None),
                      start_history(resumed, cfg, world_size), **more)


def resumed_from(cfg) -> dict | None:
    """The --resume checkpoint's history and layout (what train.py's summary starts from), or None."""
    if not cfg.resume:
        return None
    import pickle

    import torch  # only when resuming, as the request's own check of the file

    try:
        state = torch.load(cfg.resume, map_location="cpu", weights_only=True)
    except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError):
        return None  # the run itself refuses it, and says why
    keys = ("history", "epoch", "world_size", "batch_size", "grad_accum_steps")
    return {key: state[key] for key in keys if key in state} if isinstance(state, dict) else None


def start_history(resumed: dict | None, cfg, world_size: int | None) -> dict:
    """The history a resumed run started from, with its change of layout, as train.py's load_checkpoint makes it."""
    if not resumed:
        return {}
    import copy

    from dp_helpers.tool.training import layout_change

    history = copy.deepcopy(resumed.get("history", {}))
    change = layout_change(resumed, world_size, cfg.batch_size, cfg.grad_accum_steps) if world_size else None
    if change:
        history.setdefault("resumed_from", []).append(change)
    return history


def run_json(script: str, name: str, *args, world_size: int = 2, echo: bool = False, **kwargs) -> list:
    """Run dp_helpers.scripts.<script> (or a module named in full) and return the list rank 0 wrote to <name>.json."""
    module = script if "." in script else f"dp_helpers.scripts.{script}"
    run = run_ddp(module, *args, world_size=world_size, echo=echo, **kwargs)
    return json.loads((run.run_dir / f"{name}.json").read_text(encoding="utf-8"))
