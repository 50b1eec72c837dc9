"""train_fsdp.py's model and batches on one device, without FSDP: the reference its sharded runs must equal.

    python train_fsdp_one_device.py --batch-size 24   # = torchrun --nproc-per-node 2 train_fsdp.py --batch-size 12

Plain PyTorch, nothing else; the model, the text and the windows of each step are train_fsdp.py's own.
"""

import argparse

import torch
from torch import nn
from torch.nn import functional as F
from train_fsdp import (
    TEXT,
    CharLM,
    file_to_write,
    load_text,
    positive_float,
    positive_int,
    step_starts,
    stop_if_not_finite,
    windows,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=300)
    parser.add_argument("--batch-size", type=positive_int, default=32,
                        help="windows per step: train_fsdp.py's W x B x K")
    parser.add_argument("--context", type=positive_int, default=64)
    parser.add_argument("--dim", type=positive_int, default=64, help="a multiple of the 4 heads")
    parser.add_argument("--layers", type=positive_int, default=2)
    parser.add_argument("--lr", type=positive_float, default=3e-3)
    parser.add_argument("--max-grad-norm", type=positive_float, default=1.0)
    parser.add_argument("--eval-every", type=positive_int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--text", default=str(TEXT), help="a UTF-8 text to learn (default: the sonnets in data/)")
    parser.add_argument("--out", type=file_to_write, default="model_one_device.pt")
    args = parser.parse_args()
    if args.dim % 4:  # CharLM's 4 heads split the width evenly
        parser.error(f"argument --dim: {args.dim} is not a multiple of the model's 4 heads")
    return args


@torch.no_grad()
def evaluate(model: nn.Module, ids: torch.Tensor, context: int) -> float:
    """Mean loss over every non-overlapping held-out window."""
    x, y = windows(ids, torch.arange(0, len(ids) - context, context), context)
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()


def main() -> None:
    args = parse_args()
    train_ids, held_out, alphabet = load_text(args.text, args.context)
    torch.manual_seed(args.seed)  # the initial weights train_fsdp.py's rank 0 builds
    model = CharLM(len(alphabet), args.context, args.dim, args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        x, y = windows(train_ids, step_starts(args.seed, step, args.batch_size, train_ids, args.context), args.context)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        stop_if_not_finite(loss.item(), f"at step {step + 1}")
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            print(f"step {step + 1}/{args.steps}  train loss {loss.item():.4f}  "
                  f"held-out loss {evaluate(model, held_out, args.context):.4f}", flush=True)
    torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
