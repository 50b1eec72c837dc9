"""The quorum from scratch (notebook 11): before each step, the live replicas agree on who takes part.

Every replica posts its arrival at step s, with how many steps it has committed, under the step's keys in a store
that outlives any replica (a TCPStore held by the launcher: torchft calls its own service the lighthouse). The
quorum closes once every member of the last quorum has arrived, or `join_timeout_s` after the first check without
the missing ones: a replica that has died is noticed by its absence. The first quorum waits for every replica,
up to `startup_timeout_s`: processes started together can arrive seconds apart. Whoever closes it first writes the
membership and each member's committed steps with the store's compare_set, so every replica reads the same record,
including one that arrived too late (it is left out of this step and meets the next). A replica that starts again
reads the last quorum opened and posts at that step or the next, so it never waits for a step the others have left
behind; since it was not a member of the last quorum, it never closes one on the join timeout (it waits up to
`startup_timeout_s` for the members, who may be in the middle of a long step): only the members' absence is news.
Supports: any number of replicas, replicas that die or restart at any moment. Refuses: min_replicas < 1.
Not handled: the store's own death (the single point of failure), two replicas posting under one id.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import torch.distributed as dist

POLL_S = 0.005  # how often a waiting replica looks at the store again


@dataclass(frozen=True)
class Members:
    """Who takes part in step `step`: replica ids in order, and how many steps each had committed."""

    step: int
    replicas: tuple[int, ...]
    committed: tuple[int, ...]

    def index(self, replica: int) -> int:
        """This replica's rank inside the step's group."""
        return self.replicas.index(replica)

    @property
    def healthy(self) -> int:
        """The first member holding the most committed steps: the others copy its state when they lag."""
        return self.replicas[self.committed.index(max(self.committed))]


class Quorum:
    """The replicas' meeting point before each step, over a shared store."""

    def __init__(self, store: dist.Store, num_replicas: int, join_timeout_s: float = 2.0, min_replicas: int = 1,
                 startup_timeout_s: float = 60.0):
        if min_replicas < 1 or num_replicas < min_replicas:
            raise ValueError(f"a quorum needs 1 <= min_replicas <= num_replicas, not {min_replicas} and {num_replicas}.")
        self.store, self.num_replicas = store, num_replicas
        self.join_timeout_s, self.min_replicas, self.startup_timeout_s = join_timeout_s, min_replicas, startup_timeout_s

    def first_open_step(self) -> int:
        """The step a (re)starting replica should meet at: the last quorum opened (0 if none yet)."""
        return int(self.store.get("latest")) if self.store.check(["latest"]) else 0

    def meet(self, step: int, replica: int, committed: int) -> Members:
        """Arrive at step `step` and return its members (this replica may not be among them)."""
        self.store.set(f"step{step}/arrived/{replica}", str(committed))
        self.store.set("latest", str(step))  # the step this arrival meets at: a late replica may set it back one
        key = f"step{step}/members"
        if not self.store.check([key]):
            self.wait_for(*self.expected(step, replica), step)
            arrived = [r for r in range(self.num_replicas) if self.store.check([f"step{step}/arrived/{r}"])]
            counts = [int(self.store.get(f"step{step}/arrived/{r}")) for r in arrived]
            # the first writer wins, counts frozen with the list: a restarted replica may post again meanwhile
            self.store.compare_set(key, "", json.dumps({"replicas": arrived, "committed": counts}))
        record = json.loads(self.store.get(key))
        return Members(step, tuple(record["replicas"]), tuple(record["committed"]))

    def expected(self, step: int, replica: int) -> tuple[list[int], float]:
        """Whom to wait for, and how long: the last quorum's members (a non-member waits longer), or at first everyone."""
        key = f"step{step - 1}/members"
        if step > 0 and self.store.check([key]):
            members = json.loads(self.store.get(key))["replicas"]
            return members, self.join_timeout_s if replica in members else self.startup_timeout_s
        return list(range(self.num_replicas)), self.startup_timeout_s

    def wait_for(self, replicas: list[int], timeout_s: float, step: int) -> None:
        """Until these replicas have arrived, or the timeout has passed with at least min_replicas here."""
        deadline = time.monotonic() + timeout_s
        keys = [f"step{step}/arrived/{r}" for r in replicas]
        while not self.store.check(keys) and not self.store.check([f"step{step}/members"]):
            if time.monotonic() > deadline and self.count(step) >= self.min_replicas:
                return
            time.sleep(POLL_S)

    def count(self, step: int) -> int:
        """How many replicas have arrived at this step."""
        return sum(self.store.check([f"step{step}/arrived/{r}"]) for r in range(self.num_replicas))
