#!/usr/bin/python3
"""comm_bound_rank.py: one rank of tools/bench/comm_bound_bench.py's training runs.

Trains examples/train_fashion_mnist.py's CNN on Fashion-MNIST exactly as that example does
(each rank its shard of every epoch's shuffle, --batch-size images per rank per step, SGD
with momentum, learning rate --lr x world size with cosine decay over the run, rank 0's
initial weights), with one of three ways to average the gradients:

  --framework braid   braid.torch's DistributedOptimizer with --compression SPEC (launched
                      by braidrun, which sets BRAID_RANK/BRAID_SIZE)
  --framework ddp     PyTorch DistributedDataParallel over --ddp-backend gloo (default) or
                      braid (braid.torch.distributed), --ddp-hook none | fp16
                      (fp16_compress_hook) | powersgd (powerSGD_hook, --powersgd-rank R,
                      compressing from the second step as braid does from the first) |
                      braid (braid.torch.ddp_comm_hook with --compression SPEC)
                      (rank and world size from BRAID_RANK/BRAID_SIZE, store at
                      MASTER_ADDR:MASTER_PORT)
  --framework local   no communication at all: each rank trains alone, at the same time as
                      the others (what the step costs in computation on these CPUs)

Timing: each step (zero_grad, forward, backward, waiting for the gradients, the update) on a
monotonic clock, and apart its two phases that no communication can overlap: zero_grad +
forward, and the update (braid: synchronize(), then step() under skip_synchronize(), as
Horovod's API allows, so the update is timed without the wait). The training clock stops
while the test set is scored (every --eval-every steps and at the end: each rank scores
every size-th test image, the counts are summed), so "time to accuracy" is training time.
Bytes on the wire: each rank's eth0 transmit counter
(/sys/class/net/eth0/statistics/tx_bytes: IP packets with their headers) over the training,
summed over ranks, the same measure for every framework; braid's own transport and payload
bytes too. Rank 0 prints one line "RESULT {json}" at the end.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "examples"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--framework", choices=("braid", "ddp", "local"), required=True)
    p.add_argument("--compression", default="none", help="braid: compression spec")
    p.add_argument("--ddp-hook", choices=("none", "fp16", "powersgd", "braid"), default="none")
    p.add_argument("--ddp-backend", choices=("gloo", "braid"), default="gloo")
    p.add_argument("--powersgd-rank", type=int, default=2)
    p.add_argument("--epochs", type=float, default=2.0, help="epochs to train (may be fractional)")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    p.add_argument("--warmup-steps", type=int, default=5,
                   help="steps left out of the step-time median")
    p.add_argument("--eval-every", type=int, default=0, help="score the test set every N steps")
    p.add_argument("--test-images", type=int, default=10000, help="score this many test images")
    p.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    p.add_argument("--lr", type=float, default=0.01, help="times the world size")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="eth0", help="network device whose counters are read")
    return p.parse_args(argv)


def tx_bytes(device):
    try:
        with open(f"/sys/class/net/{device}/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:
        return 0


class Comm:
    """The framework's job: init, the model wrapper and optimizer, and a sum over ranks."""

    def __init__(self, args, model):
        import torch
        self.args = args
        self.framework = args.framework
        if args.framework == "braid":
            import braid.torch as hvd
            self.hvd = hvd
            hvd.init()
            self.rank, self.size = hvd.rank(), hvd.size()
        else:
            self.rank = int(os.environ.get("BRAID_RANK", "0"))
            self.size = int(os.environ.get("BRAID_SIZE", "1"))
        lr = args.lr * self.size
        if args.framework == "braid":
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
            self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            self.net = model
            self.opt = self.hvd.DistributedOptimizer(
                opt, named_parameters=model.named_parameters(), compression=args.compression)
        elif args.framework == "ddp":
            self.net, self.opt = self._ddp(model, lr)
        else:
            self.net = model
            self.opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)

    def _ddp(self, model, lr):
        import torch
        import torch.distributed as dist
        if self.args.ddp_backend == "braid" or self.args.ddp_hook == "braid":
            import braid.torch as hvd
            import braid.torch.distributed  # noqa: F401  (registers the backend)
            self.hvd = hvd
            hvd.init()
        dist.init_process_group(
            self.args.ddp_backend,
            init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            rank=self.rank, world_size=self.size)
        net = torch.nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's weights
        if self.args.ddp_hook == "braid":
            net.register_comm_hook(*self.hvd.ddp_comm_hook(
                compression=self.args.compression, named_parameters=model.named_parameters()))
        elif self.args.ddp_hook == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            net.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif self.args.ddp_hook == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
            # start_powerSGD_iter=2 is the hook's earliest start (error feedback and warm start
            # need one plain step); braid's powersgd compresses from the first.
            state = ps.PowerSGDState(process_group=None,
                                     matrix_approximation_rank=self.args.powersgd_rank,
                                     start_powerSGD_iter=2, min_compression_rate=2,
                                     use_error_feedback=True, warm_start=True,
                                     random_seed=self.args.seed)
            net.register_comm_hook(state, ps.powerSGD_hook)
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=self.args.momentum)
        return net, opt

    def update(self):
        """The step after backward: waits for the averaged gradients (braid: synchronize();
        DDP had them at the end of backward), then applies the update. Returns the time the
        update (the wrapped optimizer's step alone) began."""
        if self.framework == "braid":
            self.opt.synchronize()
            start = time.perf_counter()
            with self.opt.skip_synchronize():
                self.opt.step()
            return start
        start = time.perf_counter()
        self.opt.step()
        return start

    def sum(self, values):
        """Sums a list of floats over ranks (exact: float64, never compressed)."""
        import torch
        t = torch.tensor(values, dtype=torch.float64)
        if self.framework == "braid":
            t = self.hvd.allreduce(t, name=f"sum.{len(values)}", op=self.hvd.Sum,
                                   compression="none")
        elif self.framework == "ddp":
            import torch.distributed as dist
            dist.all_reduce(t)
        return [float(v) for v in t]

    def braid_bytes(self):
        if not hasattr(self, "hvd"):
            return {}
        # DistributedOptimizer's "grad.*", the DDP hook's "ddp0.*", the backend's "c10d.*".
        grads = [t for n, t in self.hvd.compression_stats()["tensors"].items()
                 if n.startswith(("grad.", "ddp0.", "c10d."))]
        keys = ("transport_bytes", "uncompressed_bytes", "payload_bytes")
        totals = self.sum([float(sum(t[k] for t in grads)) for k in keys])
        out = dict(zip(keys, (int(v) for v in totals)))
        out["transports"] = self.hvd.transport_description()
        return out


def evaluate(comm, model, images, labels, fmnist):
    import torch
    model.eval()
    x, y = images[comm.rank::comm.size], labels[comm.rank::comm.size]
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), 1000):
            correct += int((model(fmnist.normalize(x[i:i + 1000])).argmax(1) == y[i:i + 1000]).sum())
    model.train()
    c, n = comm.sum([correct, len(y)])
    return c / n


def train(args, comm, model, data, fmnist):
    """The training loop; returns (history, step times, steps, training seconds, phases):
    phases holds each step's (zero_grad + forward, update) seconds, the computation the
    gradients' communication cannot overlap."""
    import torch
    import torch.nn.functional as F
    train_x, train_y, test_x, test_y = data
    n = len(train_y)
    per_epoch = (n // comm.size) // args.batch_size
    total = max(1, int(args.epochs * per_epoch))
    if args.max_steps:
        total = min(total, args.max_steps)
    history, step_times, phases, clock, step = [], [], [], 0.0, 0
    # This rank's bytes on the wire over the timed steps (those after the warm-up, as
    # main() times them), up to the last scoring: what a step really sends.
    warm = args.warmup_steps if total > args.warmup_steps else 0
    tx_timed = [tx_bytes(args.device), 0]
    while step < total:
        epoch = step // per_epoch
        order = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        shard = order[comm.rank:n - n % comm.size:comm.size]
        for s in range(step % per_epoch, per_epoch):
            if step >= total:
                break
            for g in comm.opt.param_groups:  # cosine decay to 0 at the last step
                g["lr"] = 0.5 * args.lr * comm.size * (1 + math.cos(math.pi * step / total))
            idx = shard[s * args.batch_size:(s + 1) * args.batch_size]
            t0 = time.perf_counter()
            comm.opt.zero_grad()
            loss = F.cross_entropy(comm.net(fmnist.normalize(train_x[idx])), train_y[idx])
            t1 = time.perf_counter()
            loss.backward()
            t2 = comm.update()
            dt = time.perf_counter() - t0
            clock += dt
            step_times.append(dt)
            phases.append((t1 - t0, time.perf_counter() - t2))
            step += 1
            if step == warm:
                tx_timed[0] = tx_bytes(args.device)
            if step == total:
                tx_timed[1] = tx_bytes(args.device)
            if (args.eval_every and step % args.eval_every == 0) or step == total:
                acc = evaluate(comm, model, test_x, test_y, fmnist)
                history.append({"step": step, "train_time_s": clock, "test_accuracy": acc})
    return history, step_times, step, clock, phases, tx_timed


def main(argv=None):
    args = parse_args(argv)
    import torch
    import fashion_mnist_data as fmnist
    from train_fashion_mnist import Net

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model = Net()
    comm = Comm(args, model)
    train_x, train_y = fmnist.load("train")
    test_x, test_y = fmnist.load("test")
    test_x, test_y = test_x[:args.test_images], test_y[:args.test_images]
    tx0 = tx_bytes(args.device)
    history, step_times, steps, clock, phases, tx_timed = train(args, comm, model,
                                              (train_x, train_y, test_x, test_y), fmnist)
    wire, wire_timed = comm.sum([float(tx_bytes(args.device) - tx0),
                                 float(tx_timed[1] - tx_timed[0])])
    # Every step ends with every rank's gradients (braid, DDP), so rank 0's step times are
    # the job's; without communication (local) they are rank 0's own.
    timed = step_times[args.warmup_steps:] or step_times
    timed_phases = phases[args.warmup_steps:] or phases
    result = {
        "framework": args.framework, "compression": args.compression,
        "ddp_hook": args.ddp_hook, "ddp_backend": args.ddp_backend,
        "powersgd_rank": args.powersgd_rank,
        "ranks": comm.size, "steps": steps, "batch_size_per_rank": args.batch_size,
        "train_time_s": clock, "history": history,
        "step_time_median_s": statistics.median(timed),
        "forward_median_s": statistics.median(f for f, _ in timed_phases),
        "update_median_s": statistics.median(u for _, u in timed_phases),
        "timed_steps": len(timed), "wire_bytes_timed": int(wire_timed),
        "gradient_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "wire_bytes": int(wire), "final_test_accuracy": history[-1]["test_accuracy"],
        **comm.braid_bytes(),
    }
    if comm.rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    if args.framework == "braid":
        comm.hvd.shutdown()
    sys.stdout.flush()
    # DDP's processes sometimes hang or abort at interpreter exit (gloo): results are out.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
