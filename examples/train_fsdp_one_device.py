"""train_fsdp.py's model and batches on one device, without FSDP: the reference its sharded runs must equal.

    python train_fsdp_one_device.py --batch-size 24   # = torchrun --nproc-per-node 2 train_fsdp.py --batch-size 12

Plain PyTorch, nothing else; the model, the text and the windows of each step are train_fsdp.py's own.
"""

import argparse

import torch
from torch import nn
from torch.nn import functional as F
from train_fsdp import TEXT, CharLM, load_text, step_starts, windows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32, help="windows per step: train_fsdp.py's W x B x K")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--text", default=str(TEXT), help="a UTF-8 text to learn (default: the sonnets in data/)")
    parser.add_argument("--out", default="model_one_device.pt")
    return parser.parse_args()


@torch.no_grad()
def evaluate(model: nn.Module, ids: torch.Tensor, context: int) -> float:
    """Mean loss over every non-overlapping held-out window."""
    x, y = windows(ids, torch.arange(0, len(ids) - context, context), context)
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()


def main() -> None:
    args = parse_args()
    train_ids, held_out, alphabet = load_text(args.text)
    torch.manual_seed(args.seed)  # the initial weights train_fsdp.py's rank 0 builds
    model = CharLM(len(alphabet), args.context, args.dim, args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        x, y = windows(train_ids, step_starts(args.seed, step, args.batch_size, train_ids, args.context), args.context)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
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
