"""Notebook 08's exercise 5: an FSDP2 training script. Write build_model, save_checkpoint and load_checkpoint.

check_fsdp_script("my_fsdp.py") runs it under torchrun on 2 gloo ranks, stopped after 10 of 20 steps, resumes it on 3,
and compares the weights with one device on the same windows. The rest of the file is examples/train_fsdp.py's.
"""

import argparse
import gc
import math
import os
import shutil  # noqa: F401 (save_checkpoint removes the older step folders with it)
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp  # noqa: F401 (DCP: your save and load)
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,  # noqa: F401 (your save and load)
    set_model_state_dict,
    set_state_dict,  # noqa: F401 (your load)
)
from torch.distributed.device_mesh import init_device_mesh
from torch.nn import functional as F

try:  # public under this name from torch 2.6
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: F401 (your build_model)
except ImportError:
    sys.exit(f"train_fsdp.py needs torch >= 2.6 (torch.distributed.fsdp.fully_shard); this is torch {torch.__version__}")

TEXT = Path(__file__).with_name("data") / "sonnets.txt"  # nine of Shakespeare's sonnets (1609), public domain


class Block(nn.Module):
    """One transformer block: causal self-attention, then an MLP, each behind a LayerNorm and a residual."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        # no bias in qkv: a key bias adds one constant per query row, which the softmax ignores, so its true gradient
        # is zero and Adam would turn its rounding noise into full-size steps
        self.norm1, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).transpose(1, 3).unbind(2)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads, t, d / heads)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class CharLM(nn.Module):
    """A GPT-style language model over characters: embeddings, blocks, a final norm and a linear head."""

    def __init__(self, vocab: int, context: int, dim: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def load_text(path, context: int, held_out: float = 0.1) -> tuple[torch.Tensor, torch.Tensor, str]:
    """The text as character ids, split into a training part and a held-out tail; and its alphabet."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:  # said in one line, before any process group starts
        sys.exit(f"cannot read --text {path} as UTF-8 text: {exc}")
    alphabet = "".join(sorted(set(text)))
    ids = torch.tensor([alphabet.index(c) for c in text])
    cut = int(len(ids) * (1 - held_out))
    if min(cut, len(ids) - cut) <= context:  # each part needs one window of context + 1 characters
        sys.exit(f"--text {path} has {len(ids)} characters: too few, its first "
                 f"{1 - held_out:.0%} and the rest must each hold more than --context {context}")
    return ids[:cut], ids[cut:], alphabet


def windows(ids: torch.Tensor, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-character targets for windows of `context` characters starting at `starts`."""
    rows = starts[:, None] + torch.arange(context + 1)
    return ids[rows[:, :-1]], ids[rows[:, 1:]]


def step_starts(seed: int, step: int, count: int, ids: torch.Tensor, context: int) -> torch.Tensor:
    """The window starts of one optimizer step: a function of the seed and the step only, never of the rank."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(len(ids) - context, (count,), generator=g)


def build_model(args, vocab: int, device: torch.device, mesh) -> nn.Module:
    """The model sharded with FSDP2: built on the meta device, each block sharded, then the root, then allocated."""
    # your code:
    #   - build CharLM(vocab, args.context, args.dim, args.layers) under `with torch.device("meta"):` (shapes only: no
    #     rank may hold the full model's weights)
    #   - a MixedPrecisionPolicy: param_dtype torch.bfloat16 when args.precision == "bf16" (else None), reduce_dtype
    #     torch.float32
    #   - fully_shard(block, mesh=mesh, mp_policy=policy) on each of model.blocks, then fully_shard on the model itself
    #   - model.to_empty(device=device) to allocate this rank's shards, and return the model (initialise() below gives
    #     it rank 0's weights)
    raise NotImplementedError


def initialise(model: nn.Module, args, vocab: int, rank: int) -> None:
    """Rank 0 builds the initial weights on its CPU (as a pretrained model is loaded); each rank keeps its shards."""
    full = {}
    if rank == 0:
        torch.manual_seed(args.seed)
        full = CharLM(vocab, args.context, args.dim, args.layers).state_dict()
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=options)  # every rank calls it; the others pass nothing


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (argparse refuses anything else in one line)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (float() alone takes 'nan' and 'inf' too)."""
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number > 0")
    return value


def file_to_write(text: str) -> str:
    """An argparse type: a file in a folder that exists, checked now rather than after training."""
    folder = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file name")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"there is no folder {folder} to write {text} in")
    return text


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=300, help="optimizer steps in all")
    parser.add_argument("--batch-size", type=positive_int, default=16,
                        help="windows per micro-batch, per process")
    parser.add_argument("--grad-accum-steps", type=positive_int, default=1,
                        help="micro-batches per optimizer step")
    parser.add_argument("--context", type=positive_int, default=64, help="characters per window")
    parser.add_argument("--dim", type=positive_int, default=64, help="a multiple of the 4 heads")
    parser.add_argument("--layers", type=positive_int, default=2)
    parser.add_argument("--lr", type=positive_float, default=3e-3)
    parser.add_argument("--max-grad-norm", type=positive_float, default=1.0,
                        help="clip the global gradient norm to this")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="bf16: FSDP2 computes and all-gathers in bf16, reduces gradients and steps in fp32")
    parser.add_argument("--replicas", type=positive_int, default=1,
                        help="HSDP: shard within W / R ranks, replicate R times")
    parser.add_argument("--checkpoint", default=None, help="a folder: save with DCP every --save-every steps, resume")
    parser.add_argument("--save-every", type=positive_int, default=50)
    parser.add_argument("--eval-every", type=positive_int, default=50)
    parser.add_argument("--stop-after", type=positive_int, default=None,
                        help="stop after this many steps of this run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--text", default=str(TEXT), help="a UTF-8 text to learn (default: the sonnets in data/)")
    parser.add_argument("--out", type=file_to_write, default="model.pt",
                        help="the full weights, written by rank 0 at the end")
    parser.add_argument("--sample", type=int, default=200, help="characters rank 0 generates at the end")
    parser.add_argument("--timeout", type=positive_float, default=60,
                        help="seconds to wait for the others")
    args = parser.parse_args()
    if args.dim % 4:  # CharLM's 4 heads split the width evenly
        parser.error(f"argument --dim: {args.dim} is not a multiple of the model's 4 heads")
    if args.checkpoint and os.path.isfile(args.checkpoint):
        parser.error(f"argument --checkpoint: {args.checkpoint} is a file, not a folder")
    return args


def train_step(model, optimizer, args, ids, step: int, rank: int, world_size: int, device) -> float:
    """One optimizer step over --grad-accum-steps micro-batches; gradients are reduced after the last only."""
    b, k = args.batch_size, args.grad_accum_steps
    starts = step_starts(args.seed, step, k * world_size * b, ids, args.context).view(k, world_size, b)
    total = 0.0
    for i in range(k):
        x, y = (t.to(device) for t in windows(ids, starts[i, rank], args.context))
        # FSDP2's no_sync: before the last micro-batch, keep full gradients and skip the reduce-scatter
        model.set_requires_gradient_sync(i == k - 1)
        loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()) / k  # FSDP2 averages over ranks
        loss.backward()
        total += loss.item()
    nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)  # sharded gradients: the global norm
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def stop_if_not_finite(loss: float, where: str, rank: int | None = None) -> None:
    """Stop with one line when the loss is NaN or inf: every later step would only spread it. Under torchrun the
    line names the rank, and torchrun then stops the other ranks."""
    if not math.isfinite(loss):
        who = "" if rank is None else f"[rank {rank}] "
        sys.stderr.write(f"{who}loss is {loss} {where}: lower --lr?\n")  # one write: ranks' lines never interleave
        sys.exit(1)


@torch.no_grad()
def evaluate(model, ids: torch.Tensor, context: int, rank: int, world_size: int, device) -> float:
    """Mean loss over every held-out window exactly once; every rank runs the same number of forwards."""
    starts = torch.arange(0, len(ids) - context, context)  # non-overlapping windows
    per_rank = math.ceil(len(starts) / world_size)
    mine = torch.arange(rank, per_rank * world_size, world_size)
    # each forward all-gathers: a rank with one window fewer still runs it, on a stand-in window it does not count
    weight, mine = (mine < len(starts)).float(), mine.clamp(max=len(starts) - 1)
    x, y = (t.to(device) for t in windows(ids, starts[mine], context))
    model.eval()
    losses = F.cross_entropy(model(x).float().transpose(1, 2), y, reduction="none").mean(1)
    model.train()
    totals = torch.stack([(losses * weight.to(device)).sum(), weight.sum().to(device)])
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def latest_checkpoint(folder: str) -> tuple[Path | None, int]:
    """The newest complete step-N folder (one being written is still step-N.tmp) and its step; (None, 0) if none."""
    done = sorted((int(p.name[5:]), p) for p in Path(folder).glob("step-*") if p.name[5:].isdigit())
    return (done[-1][1], done[-1][0]) if done else (None, 0)


def save_checkpoint(folder: str, model, optimizer, step: int, rank: int) -> None:
    """Every rank writes its own shards (DCP); rank 0 then renames the folder into place and drops the older ones."""
    # your code: get_state_dict(model, optimizer) gives this rank's shards of both; dcp.save them, as
    # {"model": ..., "optimizer": ...}, into f"{target}.tmp" with target = Path(folder) / f"step-{step}" (every rank
    # calls dcp.save: it is a collective); then rank 0 alone os.replace-s the .tmp folder onto target and removes the
    # older step-* folders; then every rank waits at dist.barrier().
    raise NotImplementedError


def load_checkpoint(path: Path, model, optimizer) -> None:
    """Every rank reads the pieces of its own shards, whatever the world size that wrote them."""
    # your code: get_state_dict(model, optimizer) for the shards this run wants, dcp.load({"model": ...,
    # "optimizer": ...}, checkpoint_id=str(path)) into them on every rank, then set_state_dict(model, optimizer,
    # model_state_dict=..., optim_state_dict=...).
    raise NotImplementedError


def generate(weights: dict, args, alphabet: str, length: int) -> str:
    """Characters sampled from a one-device copy of the trained model (rank 0 only: no collectives)."""
    model = CharLM(len(alphabet), args.context, args.dim, args.layers)
    model.load_state_dict(weights)
    start = max(alphabet.find("\n"), 0)  # a new line, or the first character of a text without one
    idx, g = torch.tensor([[start]]), torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for _ in range(length):
            probs = F.softmax(model(idx[:, -args.context:])[0, -1], dim=0)
            idx = torch.cat([idx, torch.multinomial(probs, 1, generator=g)[None]], dim=1)
    return "".join(alphabet[i] for i in idx[0, 1:])


def resume_or_initialise(model, optimizer, args, vocab: int, rank: int) -> int:
    """Load the newest complete checkpoint, or give the model its initial weights; returns the step to start from."""
    path, start = latest_checkpoint(args.checkpoint) if args.checkpoint else (None, 0)
    if path is None:
        initialise(model, args, vocab, rank)
    else:
        load_checkpoint(path, model, optimizer)
        if rank == 0 and start >= args.steps:
            print(f"nothing left to train: {path} already holds {start} steps and --steps is "
                  f"{args.steps}", flush=True)
        elif rank == 0:
            print(f"resumed from {path} at step {start + 1} on {dist.get_world_size()} ranks", flush=True)
    return start


def save_full_weights(model, args, alphabet: str, rank: int) -> None:
    """Gather the full weights onto rank 0's CPU (every rank calls it), save them there, and print a sample."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(full, args.out)  # a plain state_dict: CharLM(...).load_state_dict on one device reads it
        if args.sample:
            print(generate(full, args, alphabet, args.sample), flush=True)


def setup(args) -> tuple[torch.device, object]:
    """The device (one GPU per process when there are enough, else the CPU), the process group and the mesh."""
    local_rank, local_world_size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if torch.cuda.device_count() >= local_world_size:
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    world_size = dist.get_world_size()
    if world_size % args.replicas:
        sys.exit(f"--replicas {args.replicas} does not divide the {world_size} processes.")
    shape, names = (args.replicas, world_size // args.replicas), ("replicate", "shard")
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=names) if args.replicas > 1 else \
        init_device_mesh(device.type, (world_size,))
    return device, mesh


def main() -> None:
    args = parse_args()
    train_ids, held_out, alphabet = load_text(args.text, args.context)  # its problems said first
    if "LOCAL_RANK" not in os.environ:
        sys.exit("start me with torchrun: torchrun --standalone --nproc-per-node 2 train_fsdp.py")
    device, mesh = setup(args)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = build_model(args, len(alphabet), device, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)  # after fully_shard: it steps the shards
    start = resume_or_initialise(model, optimizer, args, len(alphabet), rank)

    last = args.steps if args.stop_after is None else min(args.steps, start + args.stop_after)
    for step in range(start, last):
        loss = train_step(model, optimizer, args, train_ids, step, rank, world_size, device)
        stop_if_not_finite(loss, f"at step {step + 1}", rank)
        done = step + 1
        if done % args.eval_every == 0 or done == last:
            mean = torch.tensor(loss, device=device)
            dist.all_reduce(mean)
            held = evaluate(model, held_out, args.context, rank, world_size, device)
            if rank == 0:
                print(f"step {done}/{args.steps}  train loss {mean.item() / world_size:.4f}  "
                      f"held-out loss {held:.4f}", flush=True)
        if args.checkpoint and (done % args.save_every == 0 or done == last):
            save_checkpoint(args.checkpoint, model, optimizer, done, rank)

    if last == args.steps:
        save_full_weights(model, args, alphabet, rank)
    del model, optimizer, mesh  # free the sharded model and its mesh before their groups, as train_ddp.py does for DDP
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
