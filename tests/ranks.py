"""Ranks for tests without torchrun: W processes join one gloo group once and run test functions on demand.

As torch's MultiProcessTestCase does, the ranks meet through a FileStore instead of a launcher, so a
test pays the processes' start-up (importing torch: seconds) once per session, not once per run.
torchrun stays for the tests of the launcher and the CLI. `pool.run(fn, *args)` calls
`fn(info, *args)` on every rank (fn must be importable: a module-level function) and returns the
ranks' results; an exception on any rank fails the test with every rank's traceback, and the pool
is started afresh for the next test (its group may be broken).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path

from dp_helpers.tool.env import worker_threads

POOL_MARKER = "rank-pool"  # the leftover-process check ignores processes started with this DP_TEST_ID


def serve(rank: int, world_size: int, store_path: str, timeout_s: float, conn) -> None:
    """One rank: join the group, then run whatever arrives until None."""
    import torch
    import torch.distributed as dist

    from dp_helpers.tool.dist import DistInfo

    torch.set_num_threads(worker_threads())  # as launched workers; the fork server imported torch before the fork
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world_size), rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    while (job := pickle.loads(conn.recv_bytes())) is not None:
        fn, args, run_dir = job
        info = DistInfo(rank, rank, world_size, torch.device("cpu"), "gloo", rank == 0, Path(run_dir))
        try:
            reply = ("ok", fn(info, *args))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the test
            reply = ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())
        # plain pickle: tensors travel as bytes (a Pipe's own pickler would share them through file descriptors
        # and a socket in TMPDIR, which fails when that path is long)
        conn.send_bytes(pickle.dumps(reply))
    conn.close()
    os._exit(0)  # at once: gloo's threads can stall the interpreter's shutdown (see dp_helpers.tool.dist.worker)


# what every rank imports: the fork server imports it once, and each rank starts as a fork of it, in milliseconds
# instead of the seconds a fresh interpreter takes (torch; torch._dynamo, which DistributedDataParallel imports)
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "dp_helpers.tool.dist", "tests.ranks"]


def fork_server():
    """multiprocessing's forkserver context, preloading PRELOAD (the server is a fresh single-threaded process, unlike
    the pytest process, which must not fork); spawn where there is no forkserver (Windows)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


class RankError(AssertionError):
    """A function failed on at least one rank; the message holds each failing rank's traceback."""


class RankPool:
    """W rank processes in one gloo group, reused across tests."""

    def __init__(self, world_size: int, timeout_s: float = 30.0):
        self.world_size, self.timeout_s, self.broken = world_size, timeout_s, False
        ctx = fork_server()
        self.store = tempfile.NamedTemporaryFile(prefix="rank-pool-", delete=False).name
        os.unlink(self.store)  # FileStore creates it
        marker, os.environ["DP_TEST_ID"] = os.environ.get("DP_TEST_ID"), POOL_MARKER
        env = {"OMP_NUM_THREADS": str(worker_threads()), "GLOO_SOCKET_IFNAME": "lo"}  # as launched workers
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            self.conns, self.procs = [], []
            for rank in range(world_size):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=serve, args=(rank, world_size, self.store, timeout_s, child), daemon=True)
                proc.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(proc)
        finally:
            for key, value in {"DP_TEST_ID": marker, **saved}.items():
                os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)

    def run(self, fn, *args, run_dir=None) -> list:
        """fn(info, *args) on every rank; the list of results in rank order."""
        run_dir = Path(run_dir or tempfile.mkdtemp(prefix="rank-pool-run-"))
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            for conn in self.conns:
                conn.send_bytes(pickle.dumps((fn, args, str(run_dir))))
        except OSError as exc:  # a rank process died
            self.broken = True
            raise RankError(f"a rank of the pool is gone ({exc}); the next test gets a new pool") from exc
        replies = [self.reply(rank, conn) for rank, conn in enumerate(self.conns)]
        failed = [(rank, r) for rank, r in enumerate(replies) if r[0] != "ok"]
        if failed:
            self.broken = True
            raise RankError("\n".join(f"rank {rank}: {r[1]}\n{r[2]}" for rank, r in failed))
        return [r[1] for r in replies]

    def reply(self, rank: int, conn) -> tuple:
        """One rank's answer, or an error once the group's timeout (plus a margin) has passed."""
        try:
            if conn.poll(self.timeout_s + 30):
                return pickle.loads(conn.recv_bytes())
        except (EOFError, OSError) as exc:  # the rank process died (a crash, os._exit)
            return ("error", f"rank process died ({type(exc).__name__})", "")
        return ("error", f"no answer in {self.timeout_s + 30:g}s", "")

    def close(self) -> None:
        """Ask every rank to stop, then make sure it did."""
        for conn in self.conns:
            try:
                conn.send_bytes(pickle.dumps(None))
            except OSError:
                pass
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        Path(self.store).unlink(missing_ok=True)


class Pools:
    """One pool per world size for the whole session, replaced when a failure may have broken its group."""

    def __init__(self):
        self.pools: dict[int, RankPool] = {}

    def get(self, world_size: int) -> RankPool:
        """The live pool of this world size."""
        pool = self.pools.get(world_size)
        if pool is None or pool.broken:
            if pool is not None:
                pool.close()
            pool = self.pools[world_size] = RankPool(world_size)
        return pool

    def close(self) -> None:
        """Stop every pool."""
        for pool in self.pools.values():
            pool.close()
