#!/usr/bin/python3
"""comm_bound_rank.py: one rank of tools/bench/comm_bound_bench.py's training runs.

Trains one of two workloads (--workload), each as its example does, with rank 0's initial
weights:

  fmnist  examples/train_fashion_mnist.py's CNN on Fashion-MNIST: each rank its shard of
          every epoch's shuffle, --batch-size images per rank per step (default 32), SGD with
          momentum 0.9, learning rate --lr (0.01) x world size with cosine decay over the run
          (--schedule constant: without); scored by test accuracy.
  lm      examples/train_language_model.py's LSTM language model on the King James Bible:
          each rank its contiguous shard of the training tokens, --batch-size rows (default
          20) of --bptt (35) tokens per rank per step, the LSTM's state carried from step to
          step, plain SGD at a constant --lr (5) x world size (--schedule cosine: decaying),
          the averaged gradients clipped to a global norm of --clip (0.25); scored by
          validation perplexity (the held-out chapters, or their first --valid-tokens
          tokens).

with one of three ways to average the gradients:

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

Timing: each step (zero_grad, forward, backward, waiting for the gradients, the update, which
includes the clipping) on a
monotonic clock, and apart its two phases that no communication can overlap: zero_grad +
forward, and the update (braid: synchronize(), then step() under skip_synchronize(), as
Horovod's API allows, so the update is timed without the wait). The training clock stops
while the held-out set is scored (every --eval-every steps and at the end: each rank scores
its part, the sums are added up exactly), so "time to accuracy" is training time.
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


# Each workload's recipe where its flag is not given (compression_ablation.py resolves its
# runs' settings with it too).
DEFAULTS = {"fmnist": dict(batch_size=32, lr=0.01, momentum=0.9, clip=0.0, schedule="cosine"),
            "lm": dict(batch_size=20, lr=5.0, momentum=0.0, clip=0.25, schedule="constant")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--framework", choices=("braid", "ddp", "local"), required=True)
    p.add_argument("--workload", choices=("fmnist", "lm"), default="fmnist")
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
    p.add_argument("--valid-tokens", type=int, default=0,
                   help="lm: score the first N held-out tokens (0: all)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="images (fmnist, default 32) or rows (lm, default 20) per rank per step")
    p.add_argument("--bptt", type=int, default=35, help="lm: tokens per row per step")
    p.add_argument("--lr", type=float, default=None,
                   help="times the world size (default: fmnist 0.01, lm 5)")
    p.add_argument("--momentum", type=float, default=None, help="default: fmnist 0.9, lm 0")
    p.add_argument("--schedule", choices=("cosine", "constant"), default=None,
                   help="learning rate over the run: cosine decay to 0 at the last step, or "
                        "constant (default: fmnist cosine, lm constant)")
    p.add_argument("--clip", type=float, default=None,
                   help="global gradient norm to clip to after averaging (default: lm 0.25)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="eth0", help="network device whose counters are read")
    args = p.parse_args(argv)
    for k, v in DEFAULTS[args.workload].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def tx_bytes(device):
    try:
        with open(f"/sys/class/net/{device}/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:
        return 0


def scheduled_lr(args, size, step, total):
    """The learning rate of step `step` of `total`: --lr x the world size, constant or with
    cosine decay to 0 at the last step (--schedule)."""
    peak = args.lr * size
    if args.schedule == "constant":
        return peak
    return 0.5 * peak * (1 + math.cos(math.pi * step / total))


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
        kwargs = {}
        if self.args.ddp_hook == "powersgd":
            # One bucket: over gloo, powerSGD_hook with several buckets issues each bucket's
            # second all-reduce from the first's completion callback, in an order that differs
            # between ranks, and gloo pairs collectives by issue order (the LM's 22.6 MB over
            # DDP's 1 MB first bucket crashes with "op.preamble.length <= op.nbytes"). One
            # bucket is what the hook's single-bucket tests run; it forgoes overlapping the
            # backward pass, which the hook's two round trips a step cannot do much of anyway.
            grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
            cap = grad_bytes + (1 << 20)
            dist._DEFAULT_FIRST_BUCKET_BYTES = cap
            kwargs["bucket_cap_mb"] = cap / (1 << 20)
        # Broadcasts rank 0's weights.
        net = torch.nn.parallel.DistributedDataParallel(model, **kwargs)
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
        DDP had them at the end of backward), clips them to --clip if set, then applies the
        update. Returns the time the update (clipping and the wrapped optimizer's step) began."""
        import torch
        if self.framework == "braid":
            self.opt.synchronize()
        start = time.perf_counter()
        if self.args.clip:
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.args.clip)
        if self.framework == "braid":
            with self.opt.skip_synchronize():
                self.opt.step()
        else:
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


class FashionMnist:
    """examples/train_fashion_mnist.py's CNN and data: a step's loss, the learning rate of a
    step (cosine decay to 0 at the last), and the test accuracy."""
    metric = "test_accuracy"

    def __init__(self, args, size):
        import fashion_mnist_data as fmnist
        from train_fashion_mnist import Net
        self.args, self.fmnist = args, fmnist
        self.train_x, self.train_y = fmnist.load("train")
        test_x, test_y = fmnist.load("test")
        self.test_x, self.test_y = test_x[:args.test_images], test_y[:args.test_images]
        self.n = len(self.train_y)
        self.per_epoch = (self.n // size) // args.batch_size
        self.model = Net()
        self.shard, self.shard_epoch = None, -1

    def lr(self, comm, step, total):
        return scheduled_lr(self.args, comm.size, step, total)

    def loss(self, comm, step):
        import torch
        import torch.nn.functional as F
        epoch, s = divmod(step, self.per_epoch)
        if epoch != self.shard_epoch:  # this rank's part of the epoch's shuffle
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(
                self.args.seed * 1000 + epoch))
            self.shard = order[comm.rank:self.n - self.n % comm.size:comm.size]
            self.shard_epoch = epoch
        idx = self.shard[s * self.args.batch_size:(s + 1) * self.args.batch_size]
        return F.cross_entropy(comm.net(self.fmnist.normalize(self.train_x[idx])),
                               self.train_y[idx])

    def score(self, comm):
        """Test accuracy: each rank scores every size-th test image, the counts are summed."""
        import torch
        model = self.model
        model.eval()
        x, y = self.test_x[comm.rank::comm.size], self.test_y[comm.rank::comm.size]
        correct = 0
        with torch.no_grad():
            for i in range(0, len(y), 1000):
                correct += int((model(self.fmnist.normalize(x[i:i + 1000])).argmax(1)
                                == y[i:i + 1000]).sum())
        model.train()
        c, n = comm.sum([correct, len(y)])
        return c / n


class LanguageModel:
    """examples/train_language_model.py's LSTM and data: a step's loss (truncated
    backpropagation through time, the state carried from step to step and reset at each
    epoch), a constant learning rate, and the validation perplexity."""
    metric = "valid_perplexity"

    def __init__(self, args, size):
        import bible_data
        import train_language_model as lm
        self.args, self.lm, self.bible_data = args, lm, bible_data
        corpus = bible_data.Corpus()
        self.valid = corpus.valid[:args.valid_tokens] if args.valid_tokens else corpus.valid
        rank = int(os.environ.get("BRAID_RANK", "0"))
        n = len(corpus.train) // size  # this rank's contiguous shard
        self.data = bible_data.batchify(corpus.train[rank * n:(rank + 1) * n], args.batch_size)
        self.per_epoch = (len(self.data) - 1) // args.bptt
        model = lm.parse_args([])  # the example's model: its default sizes and dropout
        self.model = lm.LanguageModel(len(corpus.words), model.embedding, model.hidden,
                                      model.dropout)
        self.state = None

    def lr(self, comm, step, total):
        return scheduled_lr(self.args, comm.size, step, total)

    def loss(self, comm, step):
        s = step % self.per_epoch
        if s == 0:
            self.state = None
        x, y = self.bible_data.bptt_batch(self.data, s * self.args.bptt, self.args.bptt)
        out, state = comm.net(x, self.state)
        self.state = self.lm.detach(state)
        return self.lm.token_loss(out, y)

    def score(self, comm):
        """Validation perplexity of the first --valid-tokens held-out tokens, the ranks' sums
        of cross-entropy and tokens added up exactly."""
        loss, count = comm.sum(list(self.lm.validation_sums(
            self.model, self.valid, self.args.bptt, comm.rank, comm.size)))
        return math.exp(loss / count)


WORKLOADS = {"fmnist": FashionMnist, "lm": LanguageModel}


def train(args, comm, work):
    """The training loop; returns (history, step times, steps, training seconds, phases,
    eth0 bytes at the first and last timed steps): phases holds each step's
    (zero_grad + forward, update) seconds, the computation the gradients' communication
    cannot overlap."""
    total = max(1, int(args.epochs * work.per_epoch))
    if args.max_steps:
        total = min(total, args.max_steps)
    history, step_times, phases, clock, step = [], [], [], 0.0, 0
    # This rank's bytes on the wire over the timed steps (those after the warm-up, as
    # main() times them), up to the last scoring: what a step really sends.
    warm = args.warmup_steps if total > args.warmup_steps else 0
    tx_timed = [tx_bytes(args.device), 0]
    while step < total:
        for g in comm.opt.param_groups:
            g["lr"] = work.lr(comm, step, total)
        t0 = time.perf_counter()
        comm.opt.zero_grad()
        loss = work.loss(comm, step)
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
            history.append({"step": step, "train_time_s": clock, work.metric: work.score(comm)})
    return history, step_times, step, clock, phases, tx_timed


def main(argv=None):
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    work = WORKLOADS[args.workload](args, int(os.environ.get("BRAID_SIZE", "1")))
    model = work.model
    comm = Comm(args, model)
    tx0 = tx_bytes(args.device)
    history, step_times, steps, clock, phases, tx_timed = train(args, comm, work)
    wire, wire_timed = comm.sum([float(tx_bytes(args.device) - tx0),
                                 float(tx_timed[1] - tx_timed[0])])
    # Every step ends with every rank's gradients (braid, DDP), so rank 0's step times are
    # the job's; without communication (local) they are rank 0's own.
    timed = step_times[args.warmup_steps:] or step_times
    timed_phases = phases[args.warmup_steps:] or phases
    result = {
        "workload": args.workload, "metric": work.metric,
        "framework": args.framework, "compression": args.compression,
        "ddp_hook": args.ddp_hook, "ddp_backend": args.ddp_backend,
        "powersgd_rank": args.powersgd_rank, "lr_per_rank": args.lr,
        "momentum": args.momentum, "schedule": args.schedule,
        "ranks": comm.size, "steps": steps, "batch_size_per_rank": args.batch_size,
        "train_time_s": clock, "history": history,
        "step_time_median_s": statistics.median(timed),
        "forward_median_s": statistics.median(f for f, _ in timed_phases),
        "update_median_s": statistics.median(u for _, u in timed_phases),
        "timed_steps": len(timed), "wire_bytes_timed": int(wire_timed),
        "gradient_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "wire_bytes": int(wire), f"final_{work.metric}": history[-1][work.metric],
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
