"""Rank program: 20 training steps with braid's DistributedOptimizer or with PyTorch's
DistributedDataParallel (gloo), same model, data, seed and batch split; each rank saves its
final parameters for the test to compare.

    torch_ddp_compare.py braid OUT     (under braidrun / the test launcher)
    torch_ddp_compare.py ddp OUT       (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)

Writes OUT.rank<r>.pt. The DDP process leaves with os._exit(0) once its file is written:
the gloo backend of Debian's torch 1.13 sometimes aborts or hangs at interpreter exit.
"""

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 20
BATCH = 8  # per rank


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 8, 5, padding=2)
        self.fc1 = nn.Linear(8 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def global_batch(step, size):
    g = torch.Generator().manual_seed(step)
    return torch.randn(size * BATCH, 1, 16, 16, generator=g), \
        torch.randint(0, 10, (size * BATCH,), generator=g)


def train(model, opt, rank, size):
    for step in range(STEPS):
        x, y = global_batch(step, size)
        shard = slice(rank * BATCH, (rank + 1) * BATCH)
        opt.zero_grad()
        F.cross_entropy(model(x[shard]), y[shard]).backward()
        opt.step()


def main(mode, out):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net()
    if mode == "braid":
        import braid.torch as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        train(model, opt, rank, size)
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, f"{out}.rank{rank}.pt")
        hvd.shutdown()
        return
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    train(ddp, opt, rank, size)
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, f"{out}.rank{rank}.pt")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
