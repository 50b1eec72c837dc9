"""Memory per rank and step time for a cluster of your own, per data-parallel strategy (taught in notebook 09).

Supports a transformer described by layers, hidden size, heads, vocabulary, sequence and micro-batch, trained with
mixed-precision Adam (ZeRO's accounting: 2 bytes of parameter and 2 of gradient per value, K = 12 bytes of fp32
state) by DDP, ZeRO-1, ZeRO-2, ZeRO-3 / FSDP2 (the same bytes) and HSDP (FSDP inside a shard group, replicas across
groups). Memory: ZeRO's model states (Rajbhandari et al. 2020, section 3.1 and Figure 1) and activations per layer
(Korthikanti et al. 2022, Table 2: sbh(34 + 5as/h) bytes without recomputation, 2sbh with full activation
checkpointing). Time: 6 flops per parameter per token (8 with checkpointing) at the GPUs' sustained speed, and each
collective on a ring (alpha-beta). The bytes a collective sends per value are inputs: gradients travel in fp32 by
default (4 bytes: DDP all-reduces the fp32 gradients autocast leaves; ZeroRedundancyOptimizer runs under DDP; FSDP2
reduces in fp32 with `reduce_dtype=torch.float32`, as torchtitan and examples/train_fsdp.py set it); 2 bytes is a
bf16 compression hook or FSDP2's `reduce_dtype=torch.bfloat16`. Parameters travel in 16 bits by default (FSDP2's
`param_dtype=torch.bfloat16`, ZeRO's fp16 parameters; torch's ZeroRedundancyOptimizer broadcasts fp32 ones: 4).
Refuses, in one sentence: an unknown strategy, and an HSDP shape `init_device_mesh` would refuse (a shard group that
does not divide the GPUs). What it leaves out: temporary buffers, fragmentation, the framework's own memory, the
all-gathered layer ZeRO-3 holds while it computes, tensor/pipeline parallelism, FlashAttention (which drops the 5as/h
term), and contention between collectives; it gives both bounds of overlap rather than guess one. Checked
(tests/test_cost_model.py, notebook 09) against the ZeRO paper's Figure 1 and the Ultra-Scale Playbook's chart of
activation memory for Llama 3.1 8B, 70B and 405B.
"""

from __future__ import annotations

from dataclasses import dataclass

from dp_helpers.scratch.collectives.ring import collective_time

STRATEGIES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3 / FSDP2", "HSDP")
GRAD_BYTES = 4  # gradients reduced in fp32: what DDP under autocast and FSDP2 with reduce_dtype=float32 send
PARAM_BYTES = 2  # parameters all-gathered in bf16 (FSDP2's param_dtype) or fp16 (ZeRO's)


@dataclass(frozen=True)
class Transformer:
    """The model and its batch: the shapes the memory and the flops follow from."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    sequence: int
    micro_batch: int  # sequences per rank per step

    @property
    def parameters(self) -> int:
        """12 h^2 per layer (attention 4 h^2, MLP 8 h^2) plus the embedding, V h; biases and norms left out."""
        return 12 * self.layers * self.hidden ** 2 + self.vocab * self.hidden


@dataclass(frozen=True)
class Cluster:
    """The GPUs and their links: sustained flop/s per GPU, and (bytes/s, seconds) of the links inside and between groups."""

    gpus: int
    flops: float  # what one GPU sustains on this model (peak x MFU), not its peak
    bandwidth: float  # bytes/s per rank on the link data parallelism uses
    latency: float = 10e-6
    shard_group: int = 8  # HSDP: GPUs that shard among themselves (a node), on the fast link below
    group_bandwidth: float | None = None  # that fast link; None: the same as `bandwidth`
    group_latency: float | None = None


def check_shape(strategy: str, world_size: int, shard_group: int) -> None:
    """Refuse, in one sentence, a strategy the calculator does not know and an HSDP mesh that loses GPUs."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}.")
    if strategy == "HSDP" and (shard_group < 1 or world_size % shard_group):
        raise ValueError(f"HSDP needs a shard group that divides the GPUs: {world_size} GPUs do not split into "
                         f"groups of {shard_group}.")


def model_states(parameters: int, strategy: str, world_size: int, shard_group: int = 8, k: int = 12) -> dict:
    """Bytes per rank of parameters, gradients and optimizer state (ZeRO's 2 + 2 + K bytes per parameter)."""
    check_shape(strategy, world_size, shard_group)
    shards = {"DDP": (1, 1, 1), "ZeRO-1": (1, 1, world_size), "ZeRO-2": (1, world_size, world_size),
              "ZeRO-3 / FSDP2": (world_size,) * 3, "HSDP": (shard_group,) * 3}[strategy]
    return {"parameters": 2 * parameters / shards[0], "gradients": 2 * parameters / shards[1],
            "optimizer state": k * parameters / shards[2]}


def activations(model: Transformer, checkpointing: bool = False) -> float:
    """Bytes of activations one rank keeps for its backward (16-bit, no tensor parallelism)."""
    s, b, h, a = model.sequence, model.micro_batch, model.hidden, model.heads
    per_layer = 2 * s * b * h if checkpointing else s * b * h * (34 + 5 * a * s / h)
    return model.layers * per_layer


def memory_per_rank(model: Transformer, strategy: str, cluster: Cluster, checkpointing: bool = False) -> dict:
    """Bytes per rank: model states and activations, and their total."""
    states = model_states(model.parameters, strategy, cluster.gpus, cluster.shard_group)
    parts = {**states, "activations": activations(model, checkpointing)}
    return {**parts, "total": sum(parts.values())}


def collectives(parameters: int, strategy: str, world_size: int, shard_group: int = 8,
                grad_bytes: int = GRAD_BYTES, param_bytes: int = PARAM_BYTES) -> list[tuple[str, float, int, str]]:
    """(kind, bytes, ranks, link) of one step's collectives, at grad_bytes per gradient, param_bytes per parameter."""
    check_shape(strategy, world_size, shard_group)
    grads, params = grad_bytes * parameters, param_bytes * parameters
    if strategy == "DDP":
        return [("all_reduce", grads, world_size, "data")]
    if strategy in ("ZeRO-1", "ZeRO-2"):  # reduce-scatter the gradients, all-gather the updated parameters
        return [("reduce_scatter", grads, world_size, "data"), ("all_gather", params, world_size, "data")]
    if strategy == "ZeRO-3 / FSDP2":  # parameters gathered for the forward and again for the backward
        return [("all_gather", params, world_size, "data")] * 2 + [("reduce_scatter", grads, world_size, "data")]
    inside = [("all_gather", params, shard_group, "group")] * 2 + [("reduce_scatter", grads, shard_group, "group")]
    # each rank's gradient shard, all-reduced with the ranks that hold the same shard in the other groups
    return inside + [("all_reduce", grads / shard_group, world_size // shard_group, "data")]


def step_time(model: Transformer, strategy: str, cluster: Cluster, checkpointing: bool = False,
              grad_bytes: int = GRAD_BYTES, param_bytes: int = PARAM_BYTES) -> dict:
    """Seconds of compute and of communication per step, and the step with no overlap and with perfect overlap."""
    tokens = model.sequence * model.micro_batch
    compute = (8 if checkpointing else 6) * model.parameters * tokens / cluster.flops
    links = {"data": (cluster.latency, cluster.bandwidth),
             "group": (cluster.group_latency or cluster.latency, cluster.group_bandwidth or cluster.bandwidth)}
    sent = collectives(model.parameters, strategy, cluster.gpus, cluster.shard_group, grad_bytes, param_bytes)
    comm = sum(collective_time(kind, nbytes, ranks, *links[link]) for kind, nbytes, ranks, link in sent)
    serial, overlapped = compute + comm, max(compute, comm)
    return {"compute": compute, "communication": comm, "no overlap": serial, "perfect overlap": overlapped,
            "communication share": comm / serial}  # of the step without overlap
