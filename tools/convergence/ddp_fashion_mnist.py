#!/usr/bin/python3
"""ddp_fashion_mnist.py: the Fashion-MNIST job of examples/train_fashion_mnist.py trained with
PyTorch's DistributedDataParallel (gloo) and one of its communication hooks: the peer that
braid's compressed training is compared with.

    /usr/bin/python3 tools/convergence/ddp_fashion_mnist.py --ranks 2 --epochs 1 \\
        --train-subset 12000 --seed 0 --hook powersgd --rank 2 --start-iter 2 [--json F]

Same model, initial weights (--seed), shards, batches (--batch-size per rank), SGD with
momentum 0.9, learning rate --lr x ranks with the same per-step cosine decay, and the same
10,000 test images as the example; only the communication differs: `none` (DDP's all-reduce),
`fp16` (fp16_compress_hook) or `powersgd` (powerSGD_hook with matrix_approximation_rank
--rank, start_powerSGD_iter --start-iter (DDP accepts no less than 2 with error feedback or
warm start, its defaults here), min_compression_rate 2, random_seed --seed). It starts the
ranks itself (the way torchrun would set them up: RANK, WORLD_SIZE, MASTER_ADDR/PORT over
lo), prints rank 0's final test accuracy and, for powersgd, the hook's own compression rate
(counted over its compressed steps only) and the payload ratio over the whole run (its
plain all-reduce steps included). Debian's torch 1.13 gloo sometimes aborts or hangs at
exit, so each rank writes its result and leaves with os._exit(0).
"""
import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PYTHON = "/usr/bin/python3"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--train-subset", type=int, default=12000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hook", choices=("none", "fp16", "powersgd"), default="none")
    p.add_argument("--rank", type=int, default=1, help="powerSGD_hook's approximation rank")
    p.add_argument("--start-iter", type=int, default=2,
                   help="powerSGD_hook's start_powerSGD_iter (>= 2)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", default=None)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def rank_main(args):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    sys.path.insert(0, os.path.join(REPO, "examples"))
    import fashion_mnist_data as fmnist
    from train_fashion_mnist import Net

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    train_x, train_y = fmnist.load("train")
    if args.train_subset:
        train_x, train_y = train_x[:args.train_subset], train_y[:args.train_subset]
    test_x, test_y = fmnist.load("test")
    model = torch.nn.parallel.DistributedDataParallel(Net())  # broadcasts rank 0's weights
    state = None
    if args.hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.hook == "powersgd":
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=args.rank,
                                   start_powerSGD_iter=args.start_iter, random_seed=args.seed)
        model.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
    n = len(train_y)
    steps = (n // size) // args.batch_size
    for epoch in range(1, args.epochs + 1):  # the example's shards, batches and schedule
        order = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed * 1000 +
                                                                          epoch))
        shard = order[rank:n - n % size:size]
        for s in range(steps):
            t = ((epoch - 1) * steps + s) / (steps * args.epochs)
            for g in opt.param_groups:
                g["lr"] = 0.5 * args.lr * size * (1 + math.cos(math.pi * t))
            idx = shard[s * args.batch_size:(s + 1) * args.batch_size]
            opt.zero_grad()
            F.cross_entropy(model(fmnist.normalize(train_x[idx])), train_y[idx]).backward()
            opt.step()
    if rank == 0:
        net = model.module.eval()
        with torch.no_grad():
            correct = sum(int((net(fmnist.normalize(test_x[i:i + 1000])).argmax(1) ==
                               test_y[i:i + 1000]).sum()) for i in range(0, len(test_y), 1000))
        total_steps = steps * args.epochs
        result = {"ranks": size, "epochs": args.epochs, "seed": args.seed, "hook": args.hook,
                  "train_images": n, "test_accuracy": correct / len(test_y)}
        if state is not None:
            rate, before, after = state.compression_stats()
            dense = min(args.start_iter, total_steps)  # plain all-reduce steps
            per_step = before / max(total_steps - dense, 1)
            result.update({"rank": args.rank, "start_powerSGD_iter": args.start_iter,
                           "hook_compression_rate": float(rate),
                           "payload_ratio": total_steps * per_step /
                           (dense * per_step + after)})
        with open(args.out, "w") as f:
            json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)


def main(argv=None):
    args = parse_args(argv)
    if args.out and "RANK" in os.environ:
        return rank_main(args)
    if args.hook == "powersgd" and args.start_iter < 2:
        sys.exit("--start-iter must be >= 2: DDP refuses less with error feedback or warm start")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="braid-ddp-") as tmp:
        out = os.path.join(tmp, "result.json")
        procs = []
        for r in range(args.ranks):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.ranks), LOCAL_RANK=str(r),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                       OMP_NUM_THREADS="1")
            # The example's module imports braid.torch: find it in the build tree.
            py = os.path.join(os.environ.get("BRAID_BUILD_DIR") or os.path.join(REPO, "build"),
                              "python")
            env["PYTHONPATH"] = py + (os.pathsep + env["PYTHONPATH"]
                                      if env.get("PYTHONPATH") else "")
            procs.append(subprocess.Popen([PYTHON, os.path.abspath(__file__), *sys.argv[1:],
                                           "--out", out], env=env))
        for p in procs:
            p.wait(args.timeout)
        if not os.path.exists(out):
            sys.exit(f"no result: rank exit codes {[p.returncode for p in procs]}")
        with open(out) as f:
            result = json.load(f)
    line = f"ddp {args.hook}: test accuracy {100 * result['test_accuracy']:.2f}%"
    if "payload_ratio" in result:
        line += (f"  (rank {args.rank}, start_powerSGD_iter {args.start_iter}; hook's rate "
                 f"{result['hook_compression_rate']:.2f}x, payload ratio over the run "
                 f"{result['payload_ratio']:.2f}x)")
    print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
