#!/usr/bin/python3
"""Data-parallel training of a small NumPy MLP on scikit-learn's bundled digits dataset.

Every rank holds the same model. Each step, the global batch (--batch-size samples, the same
on every rank for a given seed and epoch) is cut into one contiguous shard per rank; each
rank computes the gradient of the mean loss over its shard and braid averages the gradients
across ranks, so every rank applies the gradient of the whole global batch: the result
equals, up to float rounding, one process training with the same global batch and seed.

Run:  braidrun -np 4 /usr/bin/python3 examples/train_digits.py --epochs 20

Model: 64 -> --hidden (ReLU) -> 10 (softmax), float32, plain SGD with momentum 0.9.
Data: sklearn.datasets.load_digits (1797 8x8 images, pixel values 0..16 scaled to 0..1),
a fixed 75/25 train/test split (random_state=0).

Reproducible: --seed fixes the initial weights and the order of the batches, so every run
and every --compression method starts from the same weights and sees the same data. (The
stochastic rounding of the 4-bit methods has its own seed, BRAID_SEED.) Rank 0 writes the
final metrics as JSON to --json PATH (test_accuracy in 0..1, and rank 0's compression byte
counters per method); tools/convergence/check_convergence.py compares them across compression
methods, and their payload ratios.
"""
import argparse
import json
import sys
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import _build_tree  # noqa: F401  (braid from build/ when not installed)
import braid


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.1, help="learning rate")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64, help="global batch size (all ranks)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--compression", default=None,
                   help="compression spec for the gradient all-reduce (default: BRAID_COMPRESSION)")
    p.add_argument("--json", default=None, help="rank 0 writes the final metrics here")
    p.add_argument("--save-weights", default=None,
                   help="each rank writes its final weights to PATH.rank<R>.npz")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def init_params(hidden, seed):
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.standard_normal((64, hidden)) * np.sqrt(2.0 / 64)).astype(np.float32),
        "b1": np.zeros(hidden, np.float32),
        "w2": (rng.standard_normal((hidden, 10)) * np.sqrt(2.0 / hidden)).astype(np.float32),
        "b2": np.zeros(10, np.float32),
    }


def forward(params, x):
    h = np.maximum(x @ params["w1"] + params["b1"], 0.0)
    logits = h @ params["w2"] + params["b2"]
    logits = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    return h, p


def loss_and_grads(params, x, y):
    """Mean cross-entropy over the rows of x and its gradient (dict of float32 arrays)."""
    n = x.shape[0]
    h, p = forward(params, x)
    loss = float(-np.log(p[np.arange(n), y] + 1e-12).mean()) if n else 0.0
    d = p.copy()
    d[np.arange(n), y] -= 1.0
    d /= max(n, 1)
    grads = {"w2": h.T @ d, "b2": d.sum(axis=0)}
    dh = (d @ params["w2"].T) * (h > 0)
    grads["w1"] = x.T @ dh
    grads["b1"] = dh.sum(axis=0)
    return loss, {k: v.astype(np.float32) for k, v in grads.items()}


def accuracy(params, x, y):
    return float((forward(params, x)[1].argmax(axis=1) == y).mean())


def main(argv=None):
    args = parse_args(argv)
    braid.init()
    rank, size = braid.rank(), braid.size()
    if rank == 0 and not args.quiet:
        # What the gradients travel over: shared memory within a host, tcp between hosts.
        print(f"{size} ranks; rank 0's data plane: {braid.transport_description()}", flush=True)

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0, stratify=digits.target)

    params = init_params(args.hidden, args.seed)
    # Same initial weights everywhere, as Horovod's broadcast_parameters does.
    for name in sorted(params):
        braid.broadcast_(params[name], root_rank=0, name="init." + name)
    velocity = {k: np.zeros_like(v) for k, v in params.items()}
    allreduce_kwargs = {} if args.compression is None else {"compression": args.compression}

    bytes_reduced = 0
    start = time.time()
    loss = float("nan")
    for epoch in range(args.epochs):
        order = np.random.default_rng(args.seed * 1000 + epoch).permutation(len(x_train))
        losses = []
        for first in range(0, len(order), args.batch_size):
            batch = order[first:first + args.batch_size]
            # Contiguous shard of the global batch; the shard's mean gradient is scaled by
            # its share of the batch so that averaging over ranks yields the batch mean.
            lo = len(batch) * rank // size
            hi = len(batch) * (rank + 1) // size
            shard_loss, grads = loss_and_grads(params, x_train[batch[lo:hi]], y_train[batch[lo:hi]])
            scale = np.float32((hi - lo) * size / len(batch))
            handles = {}
            for name in sorted(grads):
                grads[name] *= scale
                handles[name] = braid.allreduce_async_(
                    grads[name], name="grad." + name, op=braid.Average, **allreduce_kwargs)
                bytes_reduced += grads[name].nbytes
            for name in sorted(grads):
                braid.synchronize(handles[name])
                velocity[name] = args.momentum * velocity[name] + grads[name]
                params[name] -= np.float32(args.lr) * velocity[name]
            losses.append(shard_loss * (hi - lo) / len(batch))
        # Global mean training loss of the epoch (every rank's weighted shard losses summed).
        # A metric, not a gradient: exact, whatever the job's default compression is.
        epoch_loss = braid.allreduce(np.array([sum(losses) / max(len(losses), 1)]),
                                     name="epoch_loss", op=braid.Sum, compression="none")
        loss = float(epoch_loss[0])
        if rank == 0 and not args.quiet:
            print(f"epoch {epoch + 1:3d}  loss {loss:.4f}  "
                  f"test accuracy {accuracy(params, x_test, y_test):.4f}", flush=True)

    wall = time.time() - start
    test_acc = accuracy(params, x_test, y_test)
    if args.save_weights:
        np.savez(f"{args.save_weights}.rank{rank}.npz", **params)
    if rank == 0:
        print(f"final test accuracy {test_acc:.4f}  loss {loss:.4f}  "
              f"({size} ranks, {wall:.2f} s)", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": size, "epochs": args.epochs, "seed": args.seed,
                           "test_accuracy": test_acc, "test_samples": len(y_test),
                           "loss": loss, "wall_time_s": wall,
                           "gradient_bytes_reduced_per_rank": bytes_reduced,
                           "compression": args.compression or "default",
                           "transports": braid.transport_description(),
                           # Rank 0's byte counters per method (the gradients' method and
                           # "none" for the loss): check_convergence.py reads the ratios.
                           "compression_stats": braid.compression_stats()["methods"]},
                          f, indent=2)
    braid.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
