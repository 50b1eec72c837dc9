"""torchft's own runs of the cases the course builds from scratch: the reference its tests compare with where
torchft runs (an optional dependency, torch >= 2.7).

    python tests/torchft_reference.py OUT.pt diloco PERIOD DELAY ALPHA STEPS
    python tests/torchft_reference.py OUT.pt fault STEPS KILL_STEP

Replica groups of one rank each, in threads of this process (as torchft's own integration tests run them),
coordinated by an in-process lighthouse. `diloco`: two replicas train tests/test_streaming_diloco.py's model on their
own batches with torchft's DiLoCo, the fragments being the model's two linear layers; writes each replica's final
weights. `fault`: three replicas train dp_helpers/scripts/fault_tolerant.py's model with torchft's
DistributedDataParallel and OptimizerWrapper; replica 1 fails before the quorum of step KILL_STEP, starts again with
fresh weights a second later and heals from a peer; writes every replica's final weights and, per replica, the
(step, participating) of each step it committed.
"""

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from tests.test_streaming_diloco import WORLD, adamw, data, model


def replica(replica_id: int, m: nn.Module, lighthouse: str, period: int, delay: int, alpha: float, steps: int) -> dict:
    """One replica group's training under torchft's Manager and DiLoCo; its final weights."""
    from torchft.local_sgd import DiLoCo

    inner = adamw(m.parameters())
    outer = [torch.optim.SGD(layer.parameters(), lr=0.7, momentum=0.9, nesterov=True) for layer in (m[0], m[2])]
    mgr = manager(replica_id, lighthouse)  # its quorum needs both replicas: min_replica_size 2 = WORLD
    try:
        with DiLoCo(mgr, [m[0], m[2]], inner, outer, sync_every=period, fragment_sync_delay=delay,
                    fragment_update_alpha=alpha):
            for x, y in data(replica_id, steps):
                inner.zero_grad()
                nn.functional.mse_loss(m(x), y).backward()
                inner.step()  # DiLoCo's hooks on the inner optimizer send and land the fragments
    finally:
        mgr.shutdown(wait=False)
    return {k: v.clone() for k, v in m.state_dict().items()}


def manager(replica_id: int, lighthouse: str, load_state_dict=None, state_dict=None):
    """A torchft Manager for a replica group of one rank, quorum taken synchronously each step."""
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    made = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=20)), min_replica_size=2, use_async_quorum=False,
                   init_sync=False, load_state_dict=load_state_dict, state_dict=state_dict,
                   replica_id=str(replica_id), store_addr="localhost", store_port=store.port, rank=0, world_size=1,
                   lighthouse_addr=lighthouse, port=0, timeout=timedelta(seconds=20),
                   quorum_timeout=timedelta(seconds=20), connect_timeout=timedelta(seconds=20))
    made.course_store = store  # the replica group's store lives as long as its manager
    return made


class Failed(Exception):
    """The injected failure."""


def life(replica_id: int, lighthouse: str, steps: int, kill_step: int | None, built: tuple, done: list) -> dict:
    """One life of a replica, until `steps` are committed or it fails at `kill_step`; (step, participating) to `done`."""
    from torchft.optim import OptimizerWrapper

    from dp_helpers.scripts.fault_tolerant import batch

    m, inner = built

    def state() -> dict:
        return {"model": m.state_dict(), "optim": inner.state_dict()}

    def load(saved: dict) -> None:
        m.load_state_dict(saved["model"])
        inner.load_state_dict(saved["optim"])

    mgr = manager(replica_id, lighthouse, load, state)
    optimizer = OptimizerWrapper(mgr, inner)
    try:
        while mgr.current_step() < steps:
            if mgr.current_step() == kill_step:
                raise Failed(f"replica {replica_id} fails before step {kill_step}")
            optimizer.zero_grad()  # the quorum: a replica behind the others is healed here
            step = mgr.current_step()
            x, y = batch(step, replica_id)
            nn.functional.mse_loss(m(x), y).backward()
            # averaged over the participants (torchft's DDP wrapper does this in a comm hook, which fails on torch
            # 2.13 with torchft 0.2.0: 'Future' object has no attribute '_fut')
            for work in [mgr.allreduce(p.grad) for p in m.parameters()]:
                work.wait()
            participating = mgr.is_participating()
            optimizer.step()  # taken only if every participant's all-reduce succeeded (should_commit)
            if mgr.current_step() == step + 1:
                done.append((step, participating))
            time.sleep(0.1)  # paced, so that the replica that failed comes back before the others finish
    finally:
        mgr.shutdown(wait=False)
    return {k: v.clone() for k, v in m.state_dict().items()}


def fault(out: str, steps: int, kill_step: int, lighthouse: str) -> None:
    """Three replicas; replica 1 fails before kill_step and comes back with fresh weights a second later."""
    from dp_helpers.scripts.fault_tolerant import model_and_optimizer

    built = [model_and_optimizer() for _ in range(3)]  # here: it seeds torch's one generator, which threads share

    def replica_main(r: int):
        done = []
        try:
            return life(r, lighthouse, steps, kill_step if r == 1 else None, built[r], done), done
        except Failed:
            time.sleep(1.0)  # down for a second; then a new life with fresh state, off the others' weights
            m, inner = model_and_optimizer()
            with torch.no_grad():
                for p in m.parameters():
                    p.add_(1.0)  # only healing from a peer can make these equal to the survivors'
            done.append(("second life", None))
            return life(r, lighthouse, steps, None, (m, inner), done), done

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = [pool.submit(replica_main, r) for r in range(3)]
        torch.save([r.result() for r in results], out)


def main() -> None:
    from torchft._torchft import LighthouseServer

    out, case, numbers = sys.argv[1], sys.argv[2], sys.argv[3:]
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2 if case == "fault" else WORLD, join_timeout_ms=500)
    try:
        if case == "fault":
            fault(out, int(numbers[0]), int(numbers[1]), lighthouse.address())
            return
        period, delay, alpha, steps = int(numbers[0]), int(numbers[1]), float(numbers[2]), int(numbers[3])
        with ThreadPoolExecutor(max_workers=WORLD) as pool:
            models = [model(0) for _ in range(WORLD)]  # here: model() seeds torch's one generator, which threads share
            runs = [pool.submit(replica, r, models[r], lighthouse.address(), period, delay, alpha, steps)
                    for r in range(WORLD)]
            torch.save([run.result() for run in runs], out)
    finally:
        lighthouse.shutdown()


if __name__ == "__main__":
    main()
