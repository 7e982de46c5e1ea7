#!/usr/bin/python3
"""Data-parallel training of a small CNN on Fashion-MNIST with braid.torch.

    build/tools/braidrun/braidrun -np 4 /usr/bin/python3 examples/train_fashion_mnist.py

Horovod's recipe: every rank trains on its shard of each epoch's shuffled training set with
``--batch-size`` images per step; the learning rate is ``--lr`` times the world size (the
global batch grows with it); rank 0's initial weights and optimizer state are broadcast;
``DistributedOptimizer`` all-reduces each gradient as backward produces it; metrics are
reduced over ranks, so the test accuracy printed is that of the whole test set.

Model: conv 5x5 (16) - max-pool - conv 5x5 (32) - max-pool - fc 128 - fc 10, ReLU, 215k
parameters, float32; SGD with momentum. Data: Debian's dataset-fashion-mnist (see
fashion_mnist_data.py); ``--train-subset N`` trains on the first N training images (the CI
job uses 12,000). Test: the 10,000 test images, split over ranks, after every epoch.

Output: a progress bar per epoch on rank 0 (tqdm; a line every 10 s when the output is not a
terminal, e.g. under braidrun), the test accuracy after each epoch, and at the end the wall
time, the time to ``--target-accuracy``, the gradient bytes on the wire (summed over ranks)
against those of an uncompressed all-reduce (the wire ratio) and the payload ratio (the
gradients against their compressed form alone, without the indices and status words the wire
also carries); ``--json PATH`` writes the same from rank 0, with rank 0's
uncompressed and payload bytes per gradient tensor.

Reproducible: ``--seed`` fixes the initial weights and the shuffling, so every
``--compression`` method starts from the same weights and sees the same batches (4-bit
rounding draws come from BRAID_SEED). Each rank uses one thread (several ranks share the
host's cores).
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _build_tree  # noqa: E402,F401  (braid from build/ when not installed)
import fashion_mnist_data as fmnist  # noqa: E402

import braid.torch as hvd  # noqa: E402


def positive_int(text):
    """argparse type: an integer of at least 1 (0 epochs or images would train nothing)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def fraction(text):
    """An accuracy as a fraction: 0.88, not 88 (which would never be reached)."""
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1], such as 0.88, got "
                                         f"{text}")
    return value


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=positive_int, default=3)
    p.add_argument("--batch-size", type=positive_int, default=32, help="images per rank per step")
    p.add_argument("--lr", type=float, default=0.01,
                   help="learning rate for one rank (scaled by the world size)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--schedule", choices=("cosine", "constant"), default="cosine",
                   help="learning rate over the run: cosine decay to 0 per step, or constant")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compression", default=None,
                   help="gradient compression spec (fp16, fp4, 'fp4:ef=1', ...); default: "
                        "BRAID_COMPRESSION, else none")
    p.add_argument("--target-accuracy", type=fraction, default=0.88,
                   help="report the time until the test accuracy first reaches this (0..1)")
    p.add_argument("--train-subset", type=non_negative_int, default=0,
                   help="train on the first N training images only (0: all 60,000)")
    p.add_argument("--data-dir", default=fmnist.DEFAULT_DIR)
    p.add_argument("--json", default=None, help="rank 0 writes the results here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class _Lines:
    """A file for tqdm when the output is a pipe: each refresh becomes one line (braidrun
    prefixes whole lines and cannot show carriage-return updates)."""

    def __init__(self, f):
        self.f = f

    def write(self, s):
        s = s.replace("\r", "").strip()
        if s:
            self.f.write(s + "\n")

    def flush(self):
        self.f.flush()


def progress(steps, epoch, enabled):
    if not enabled:
        return range(steps)
    from tqdm import tqdm
    tty = sys.stdout.isatty()
    return tqdm(range(steps), desc=f"epoch {epoch}", unit="step", ascii=not tty, ncols=88,
                mininterval=0.5 if tty else 10.0, file=sys.stdout if tty else _Lines(sys.stdout))


def evaluate(model, images, labels, rank, size):
    """Test accuracy and mean loss over the whole test set: each rank scores every size-th
    image; counts and sums are added up over ranks (exactly: compression off)."""
    model.eval()
    x, y = images[rank::size], labels[rank::size]
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y), 1000):
            out = model(fmnist.normalize(x[i:i + 1000]))
            correct += int((out.argmax(1) == y[i:i + 1000]).sum())
            loss += float(F.cross_entropy(out, y[i:i + 1000], reduction="sum"))
    totals = hvd.allreduce(torch.tensor([correct, len(y), loss], dtype=torch.float64),
                           name="eval.totals", op=hvd.Sum, compression="none")
    model.train()
    return float(totals[0] / totals[1]), float(totals[2] / totals[1])


def wire_bytes():
    """(transport, uncompressed, payload, reference transport) bytes of the gradient
    all-reduces, summed over ranks (braid's byte counters: docs/compression.md, "Byte
    counters"; every rank calls this)."""
    grads = [t for n, t in hvd.compression_stats()["tensors"].items() if n.startswith("grad.")]
    mine = torch.tensor([sum(t[k] for t in grads) for k in
                         ("transport_bytes", "uncompressed_bytes", "payload_bytes",
                          "reference_transport_bytes")],
                        dtype=torch.int64)
    return [int(v) for v in hvd.allreduce(mine, name="bytes", op=hvd.Sum, compression="none")]


def rank0_tensor_bytes():
    """This rank's byte counters per gradient: {name: {uncompressed_bytes, payload_bytes}}
    (how much of each tensor a compression method sent)."""
    return {n[len("grad."):]: {k: t[k] for k in ("uncompressed_bytes", "payload_bytes")}
            for n, t in sorted(hvd.compression_stats()["tensors"].items())
            if n.startswith("grad.")}


def steps_per_epoch(n, args, size):
    return (n // size) // args.batch_size


def train_epoch(model, opt, images, labels, epoch, args, rank, size):
    """One epoch on this rank's shard; returns the mean training loss over all ranks."""
    n = len(labels)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
    shard = order[rank:n - n % size:size]  # equal shards: every rank runs the same steps
    steps = steps_per_epoch(n, args, size)
    total_steps = steps * args.epochs
    total = torch.zeros(1, dtype=torch.float64)
    for s in progress(steps, epoch, rank == 0 and not args.no_progress):
        if args.schedule == "cosine":
            # Cosine decay (Loshchilov & Hutter 2017, without restarts) to 0 at the last step.
            t = ((epoch - 1) * steps + s) / total_steps
            for g in opt.param_groups:
                g["lr"] = 0.5 * args.lr * size * (1 + math.cos(math.pi * t))
        idx = shard[s * args.batch_size:(s + 1) * args.batch_size]
        opt.zero_grad()
        loss = F.cross_entropy(model(fmnist.normalize(images[idx])), labels[idx])
        loss.backward()
        opt.step()
        total += loss.detach()
    return float(hvd.allreduce(total / max(steps, 1), name="train.loss", compression="none"))


def main(argv=None):
    args = parse_args(argv)
    hvd.init()
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed)

    train_x, train_y = fmnist.load("train", args.data_dir)
    if args.train_subset:
        train_x, train_y = train_x[:args.train_subset], train_y[:args.train_subset]
    test_x, test_y = fmnist.load("test", args.data_dir)

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=args.compression)
    # The method in force: --compression, else the job's default (braidrun --compression sets
    # BRAID_COMPRESSION), else none.
    method = args.compression or os.environ.get("BRAID_COMPRESSION") or "none"
    if rank == 0:
        print(f"training on {len(train_y)} images, {size} ranks x {args.batch_size} per step, "
              f"lr {args.lr * size:g}, compression {method}", flush=True)

    history, time_to_target = [], None
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        loss = train_epoch(model, opt, train_x, train_y, epoch, args, rank, size)
        acc, test_loss = evaluate(model, test_x, test_y, rank, size)
        elapsed = time.perf_counter() - start
        if time_to_target is None and acc >= args.target_accuracy:
            time_to_target = elapsed
        history.append({"epoch": epoch, "train_loss": loss, "test_loss": test_loss,
                        "test_accuracy": acc, "elapsed_s": elapsed})
        if rank == 0:
            print(f"epoch {epoch}: train loss {loss:.4f}  test loss {test_loss:.4f}  "
                  f"test accuracy {100 * acc:.2f}%  ({elapsed:.1f} s)", flush=True)
    wall = time.perf_counter() - start
    transport, uncompressed, payload, reference = wire_bytes()
    ratio = uncompressed / payload if payload else 0.0  # the payload ratio
    wire_ratio = reference / transport if transport else 0.0
    if rank == 0:
        target = f"{time_to_target:.1f} s" if time_to_target is not None else "not reached"
        print(f"final test accuracy {100 * history[-1]['test_accuracy']:.2f}%  wall time "
              f"{wall:.1f} s  time to {100 * args.target_accuracy:g}%: {target}", flush=True)
        # Two ratios, each named for what it divides: the wire ratio (what an uncompressed
        # all-reduce would send / what was sent: indices, scales and status words included)
        # and the payload ratio (the gradients / their compressed form alone).
        print(f"gradient bytes on the wire (all ranks): {transport / 1e6:.1f} MB, against "
              f"{reference / 1e6:.1f} MB for a bandwidth-optimal uncompressed all-reduce: "
              f"wire ratio {wire_ratio:.2f}x (payload ratio {ratio:.2f}x)", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": size, "epochs": args.epochs, "seed": args.seed,
                           "batch_size_per_rank": args.batch_size, "lr": args.lr * size,
                           "compression": method,
                           "train_images": len(train_y), "test_images": len(test_y),
                           "test_accuracy": history[-1]["test_accuracy"],
                           "target_accuracy": args.target_accuracy,
                           "time_to_target_s": time_to_target, "wall_time_s": wall,
                           "transport_bytes": transport, "uncompressed_bytes": uncompressed,
                           "payload_bytes": payload, "compression_ratio": ratio,
                           "payload_ratio": ratio, "reference_transport_bytes": reference,
                           "wire_ratio": wire_ratio,
                           "tensors": rank0_tensor_bytes(), "history": history}, f, indent=2)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
