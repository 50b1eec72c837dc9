"""torchft's own Streaming DiLoCo on tests/test_streaming_diloco.py's model, data and schedule: the reference the
course's StreamingDiLoCo is compared with where torchft runs (an optional dependency, torch >= 2.7).

    python tests/torchft_reference.py OUT.pt PERIOD DELAY ALPHA STEPS

Two replica groups of one rank each, in threads of this process (as torchft's own integration tests run them),
coordinated by an in-process lighthouse; each replica trains on its own batches, the fragments are the model's two
linear layers. Writes each replica's final weights.
"""

import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from tests.test_streaming_diloco import WORLD, adamw, data, model


def replica(replica_id: int, m: nn.Module, lighthouse: str, period: int, delay: int, alpha: float, steps: int) -> dict:
    """One replica group's training under torchft's Manager and DiLoCo; its final weights."""
    from torchft.local_sgd import DiLoCo
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    inner = adamw(m.parameters())
    outer = [torch.optim.SGD(layer.parameters(), lr=0.7, momentum=0.9, nesterov=True) for layer in (m[0], m[2])]
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=20)), min_replica_size=WORLD,
                      use_async_quorum=False, init_sync=False, load_state_dict=None, state_dict=None,
                      replica_id=str(replica_id), store_addr="localhost", store_port=store.port, rank=0,
                      world_size=1, lighthouse_addr=lighthouse, port=0, timeout=timedelta(seconds=20),
                      quorum_timeout=timedelta(seconds=20), connect_timeout=timedelta(seconds=20))
    try:
        with DiLoCo(manager, [m[0], m[2]], inner, outer, sync_every=period, fragment_sync_delay=delay,
                    fragment_update_alpha=alpha):
            for x, y in data(replica_id, steps):
                inner.zero_grad()
                nn.functional.mse_loss(m(x), y).backward()
                inner.step()  # DiLoCo's hooks on the inner optimizer send and land the fragments
    finally:
        manager.shutdown(wait=False)
    return {k: v.clone() for k, v in m.state_dict().items()}


def main() -> None:
    from torchft._torchft import LighthouseServer

    out, period, delay, alpha, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), \
        int(sys.argv[5])
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=WORLD)
    try:
        with ThreadPoolExecutor(max_workers=WORLD) as pool:
            models = [model(0) for _ in range(WORLD)]  # here: model() seeds torch's one generator, which threads share
            runs = [pool.submit(replica, r, models[r], lighthouse.address(), period, delay, alpha, steps)
                    for r in range(WORLD)]
            torch.save([run.result() for run in runs], out)
    finally:
        lighthouse.shutdown()


if __name__ == "__main__":
    main()
