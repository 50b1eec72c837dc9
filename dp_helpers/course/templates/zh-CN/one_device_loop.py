"""笔记本 00 练习用的单设备训练循环：把它复制为 my_ddp.py，再改写成 DDP。

    python one_device_loop.py --batch-size 48 --out weights.pt
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset


def main() -> None:
    """在一个设备上训练线性模型，并保存它的权重。"""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=48, help="samples per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--out", default="weights.pt", help="where to save the trained weights")
    args = parser.parse_args()

    g = torch.Generator().manual_seed(0)
    features = torch.randn(960, 8, generator=g)
    dataset = TensorDataset(features, features @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(960, 1, generator=g))
    order = torch.Generator()
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=RandomSampler(dataset, generator=order))
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for epoch in range(args.epochs):
        order.manual_seed(epoch)  # 每轮一个新的顺序
        total, count = 0.0, 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            total, count = total + loss.item() * len(x), count + len(x)
        print(f"epoch {epoch + 1} loss {total / count:.6f}")

    torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
