#!/usr/bin/python3
"""link_allreduce_rank.py: one rank of comm_bound_bench.py's all-reduce sweep (--sweep).

    braidrun -np N -H ... /usr/bin/python3 tools/bench/link_allreduce_rank.py \\
        --framework braid|gloo -b 4K -e 64M -f 4 -n 5 -w 1

float32 sum all-reduce, in place, timed as nccl-tests does: per size, `-w` untimed calls, a
barrier, `-n` timed calls; a rank's time is its mean per call, the row's time the max over
ranks; algbw = bytes / time, busbw = algbw x 2(n-1)/n (GB/s, 1e9). braid through its Python
API (braid.allreduce_, compression none: negotiation included, as a training job pays it);
gloo through torch.distributed (rank and size from braidrun's BRAID_RANK / BRAID_SIZE, its
store at MASTER_ADDR:MASTER_PORT). Every element is checked after the timed calls (inputs are
small integers, so sums are exact). Rank 0 prints one "RESULT {json}" line.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_arg(text):
    t = text.strip().upper()
    unit = t[-1] if t and t[-1] in SUFFIX else ""
    return int(t[:-1] if unit else t) * SUFFIX[unit]


class Braid:
    def __init__(self):
        import braid
        self.b = braid
        braid.init()
        self.rank, self.size = braid.rank(), braid.size()

    def allreduce(self, buf, tag):
        self.b.allreduce_(buf, name=f"sweep.{tag}", op=self.b.Sum, compression="none")

    def barrier(self):
        self.b.barrier()

    def max(self, value):
        return float(self.b.allreduce(np.array([value]), name="sweep.max", op=self.b.Max,
                                      compression="none")[0])

    def close(self):
        self.b.shutdown()


class Gloo:
    def __init__(self):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        self.rank = int(os.environ["BRAID_RANK"])
        self.size = int(os.environ["BRAID_SIZE"])
        dist.init_process_group(
            "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            rank=self.rank, world_size=self.size)

    def allreduce(self, buf, tag):
        self.dist.all_reduce(self.torch.from_numpy(buf))

    def barrier(self):
        self.dist.barrier()

    def max(self, value):
        t = self.torch.tensor([value], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t[0])

    def close(self):
        pass


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--framework", choices=("braid", "gloo"), required=True)
    p.add_argument("-b", "--minbytes", type=size_arg, default=4096)
    p.add_argument("-e", "--maxbytes", type=size_arg, default=64 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("-n", "--iters", type=int, default=5)
    p.add_argument("-w", "--warmup", type=int, default=1)
    args = p.parse_args(argv)
    comm = Braid() if args.framework == "braid" else Gloo()
    n = comm.size
    buf = np.empty(args.maxbytes // 4, np.float32)
    rows, size = [], args.minbytes
    while size <= args.maxbytes:
        count = size // 4
        view = buf[:count]
        for _ in range(args.warmup):
            view[:] = 1
            comm.allreduce(view, size)
        view[:] = np.arange(count, dtype=np.float32) % 7 + comm.rank
        comm.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            comm.allreduce(view, size)
        mine = (time.perf_counter() - start) / args.iters
        # After k in-place sums of x_r: n^(k-1) * sum_r x_r (exact: small integers).
        base = np.arange(count, dtype=np.float64) % 7
        want = (n ** (args.iters - 1)) * (n * base + n * (n - 1) / 2)
        wrong = int(np.count_nonzero(view != want.astype(np.float32)))
        t = comm.max(mine)
        algbw = size / t / 1e9
        rows.append({"bytes": size, "time_us": 1e6 * t, "algbw_gbps": algbw,
                     "busbw_gbps": algbw * 2 * (n - 1) / n, "wrong": int(comm.max(wrong))})
        size *= args.stepfactor
    if comm.rank == 0:
        print("RESULT " + json.dumps({"framework": args.framework, "ranks": n, "rows": rows}),
              flush=True)
    comm.close()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
