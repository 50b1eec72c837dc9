"""Replicas that average each step over whoever is alive; one of them killed at a chosen step, restarted, healed.

    run_replicas("dp_helpers/scripts/fault_tolerant.py", "--steps", 40, "--kill", "1:10", replicas=3)

Each replica is its own torchrun (tool/launch/replicas.py gives it DP_FT_STORE, DP_REPLICA_ID, DP_NUM_REPLICAS).
Every replica writes one JSON line per step it took part in (<out>.replica<r>.jsonl) and its final weights.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from dp_helpers.scratch.fault_tolerance.quorum import Quorum
from dp_helpers.scratch.fault_tolerance.replica import Replica


def batch(step: int, replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Replica `replica`'s batch at step `step`: the same wherever it is computed (the one-process replay too)."""
    gen = torch.Generator().manual_seed(1000 * step + replica)
    x = torch.randn(16, 8, generator=gen)
    return x, x[:, :2].sum(1, keepdim=True)


def model_and_optimizer(batchnorm: bool = False) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The same starting weights on every replica, and SGD with momentum (a state that healing must copy)."""
    torch.manual_seed(0)
    norm = [nn.BatchNorm1d(16)] if batchnorm else []  # buffers: running statistics the replicas must keep equal
    model = nn.Sequential(nn.Linear(8, 16), *norm, nn.Tanh(), nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def arguments() -> argparse.Namespace:
    """Its flags: --steps, --kill, --step-seconds, --join-timeout, --rejoin-after, --batchnorm, --out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--kill", default="", help="REPLICA:STEP, e.g. 1:10")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="each step's pretend compute")
    parser.add_argument("--join-timeout", type=float, default=2.0, help="seconds a quorum waits for a missing replica")
    parser.add_argument("--rejoin-after", type=float, default=0.0,
                        help="seconds a replica started again waits before it meets the others (a new machine booting)")
    parser.add_argument("--batchnorm", action="store_true", help="a BatchNorm layer: buffers to keep equal")
    parser.add_argument("--out", default="ft")
    return parser.parse_args()


def main() -> None:
    """Train; die once if told to; write each step's record and the final weights."""
    args = arguments()
    me, replicas = int(os.environ["DP_REPLICA_ID"]), int(os.environ["DP_NUM_REPLICAS"])
    kill_replica, kill_step = map(int, args.kill.split(":")) if args.kill else (-1, -1)
    first_life = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if not first_life:  # without it, a fast machine restarts the replica within the join timeout: no step without it
        time.sleep(args.rejoin_after)
    host, port = os.environ["DP_FT_STORE"].rsplit(":", 1)
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
    model, optimizer = model_and_optimizer(args.batchnorm)
    replica = Replica(model, optimizer, Quorum(store, replicas, join_timeout_s=args.join_timeout), me)
    with open(f"{args.out}.replica{me}.jsonl", "a") as log:
        while replica.step < args.steps:
            if me == kill_replica and replica.step == kill_step and first_life:
                os.kill(os.getpid(), signal.SIGKILL)  # a hard death: no exception, no goodbye
            members = replica.start_step()
            if members.step >= args.steps:  # came back after the others had finished
                break
            x, y = batch(members.step, me)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            time.sleep(args.step_seconds)
            ok = replica.step_if_agreed()
            log.write(json.dumps({"step": members.step, "members": members.replicas, "ok": ok,
                                  "committed": replica.committed, "life": 0 if first_life else 1}) + "\n")
            log.flush()
    torch.save(model.state_dict(), f"{args.out}.replica{me}.pt")
    print(f"replica {me}: {replica.committed} steps committed", flush=True)


if __name__ == "__main__":
    main()
