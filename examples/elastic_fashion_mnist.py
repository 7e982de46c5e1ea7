#!/usr/bin/python3
"""Elastic data-parallel training of the Fashion-MNIST CNN, in Horovod's elastic style.

    build/tools/braidrun/braidrun -np 3 --min-np 2 /usr/bin/python3 \\
        examples/elastic_fashion_mnist.py --epochs 2

Written as Horovod's documentation writes an elastic PyTorch script (``hvd.elastic.run``,
``TorchState(model, optimizer, epoch=..., batch=...)``, ``ElasticSampler``,
``register_reset_callbacks``, ``state.commit()`` every few batches); only the import line
names braid. Kill a rank (``kill -9``) while it trains: the others restore the last commit,
form a smaller job and go on, with the learning rate scaled to the new world size and the
epoch's remaining images re-sharded over it.

Model and data as examples/train_fashion_mnist.py (conv-conv-fc-fc, 215k parameters; the
first ``--train-subset`` training images; the whole test set at the end). ``--report DIR``
writes one JSON line per event to ``DIR/worker<BRAID_WORKER>.jsonl`` (the process's number,
which stays while its rank changes): ``start`` (each time training starts or restarts: the
world size, rank, epoch, batch and a checksum of the parameters), ``step`` (the first step
completed after each start), ``commit`` (epoch, batch) and ``end`` (checksum, test
accuracy); the tests and tools/bench/elastic_bench.py read it.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _build_tree  # noqa: E402,F401  (braid from build/ when not installed)
import fashion_mnist_data as fmnist  # noqa: E402
from train_fashion_mnist import Net  # noqa: E402  (the same CNN)

import braid.torch as hvd  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    p.add_argument("--lr", type=float, default=0.01, help="per rank: lr * size() is used")
    p.add_argument("--batches-per-commit", type=int, default=5)
    p.add_argument("--train-subset", type=int, default=6000)
    p.add_argument("--compression", default="none", help="a braid method: fp4, powersgd:rank=2")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--step-delay", type=float, default=0.0,
                   help="seconds of sleep per step (tests: a slower job to kill mid-epoch)")
    p.add_argument("--report", default="", help="directory for the JSON event lines")
    p.add_argument("--data-dir", default=fmnist.DEFAULT_DIR)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(args.seed)
    images, labels = fmnist.load("train", args.data_dir)
    images, labels = images[:args.train_subset], labels[:args.train_subset]
    train_set = torch.utils.data.TensorDataset(fmnist.normalize(images), labels)

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=args.compression)
    train_sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=args.seed)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size,
                                               sampler=train_sampler)

    report_file = None
    if args.report:
        path = os.path.join(args.report, f"worker{os.environ.get('BRAID_WORKER', '0')}.jsonl")
        report_file = open(path, "a", buffering=1)

    def report(event, **fields):
        if report_file is not None:
            fields.update(event=event, pid=os.getpid(), time=time.time())
            report_file.write(json.dumps(fields) + "\n")

    def checksum():
        return float(sum(p.double().sum() * (i + 1)
                         for i, p in enumerate(model.state_dict().values())))

    def on_state_reset():
        # The global batch changed with the world size: so does the learning rate.
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    @hvd.elastic.run
    def train(state):
        report("start", size=hvd.size(), rank=hvd.rank(), epoch=state.epoch, batch=state.batch,
               checksum=checksum())
        first_step = True
        for state.epoch in range(state.epoch, args.epochs):
            if state.train_sampler.epoch != state.epoch:  # a new epoch, not a resumed one
                state.train_sampler.set_epoch(state.epoch)
            for batch_idx, (x, y) in enumerate(train_loader):
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                if first_step:
                    report("step", size=hvd.size())
                    first_step = False
                if args.step_delay:
                    time.sleep(args.step_delay)
                state.train_sampler.record_batch(batch_idx, args.batch_size)
                state.batch += 1
                if state.batch % args.batches_per_commit == 0:
                    state.commit()
                    report("commit", epoch=state.epoch, batch=state.batch)
            state.batch = 0

    state = hvd.elastic.TorchState(model, optimizer, train_sampler=train_sampler, epoch=0,
                                   batch=0)
    state.register_reset_callbacks([on_state_reset])
    train(state)

    test_images, test_labels = fmnist.load("test", args.data_dir)
    x, y = test_images[hvd.rank()::hvd.size()], test_labels[hvd.rank()::hvd.size()]
    with torch.no_grad():
        correct = int((model(fmnist.normalize(x)).argmax(1) == y).sum())
    totals = hvd.allreduce(torch.tensor([correct, len(y)], dtype=torch.float64), op=hvd.Sum,
                           name="test.totals")
    accuracy = float(totals[0] / totals[1])
    report("end", size=hvd.size(), rank=hvd.rank(), checksum=checksum(), accuracy=accuracy)
    if hvd.rank() == 0:
        print(f"test accuracy {accuracy:.4f} on {hvd.size()} ranks", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
