#!/usr/bin/python3
"""Horovod's PyTorch MNIST example, call for call, on braid.

    build/tools/braidrun/braidrun -np 2 /usr/bin/python3 examples/horovod_pytorch_mnist.py \\
        --epochs 1 --fp16-allreduce

This script follows Horovod's examples/pytorch/pytorch_mnist.py step by step: init, one
thread per rank, DistributedSampler shards, the learning rate scaled by the world size,
broadcast_parameters and broadcast_optimizer_state from rank 0, DistributedOptimizer with
``Compression.fp16`` (``--fp16-allreduce``), logging on rank 0, and test metrics averaged
with ``allreduce``. The only line that names braid is the import: with
``import horovod.torch as hvd`` instead, it runs on Horovod unchanged.

Two differences, both about data, not Horovod's API: the images are Fashion-MNIST read from
Debian's dataset-fashion-mnist package (no download, no torchvision), and
``--train-subset N`` can shorten the run (tests use it). (``_build_tree`` only lets the
script find braid in a source checkout's build/ without PYTHONPATH.)
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _build_tree  # noqa: E402,F401  (the build tree's package when none is installed)
import fashion_mnist_data  # noqa: E402

import braid.torch as hvd  # noqa: E402

parser = argparse.ArgumentParser(description="PyTorch MNIST-style example")
parser.add_argument("--batch-size", type=int, default=64, help="input batch size for training")
parser.add_argument("--test-batch-size", type=int, default=1000,
                    help="input batch size for testing")
parser.add_argument("--epochs", type=int, default=10, help="number of epochs to train")
parser.add_argument("--lr", type=float, default=0.01, help="learning rate")
parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum")
parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA")
parser.add_argument("--seed", type=int, default=42, help="random seed")
parser.add_argument("--log-interval", type=int, default=10,
                    help="how many batches to wait before logging training status")
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--use-adasum", action="store_true", default=False,
                    help="use adasum algorithm to do reduction")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0,
                    help="apply gradient predivide factor in optimizer (default: 1.0)")
parser.add_argument("--data-dir", default=fashion_mnist_data.DEFAULT_DIR,
                    help="directory of the idx files")
parser.add_argument("--train-subset", type=int, default=0,
                    help="use the first N training images only (0: all)")


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def dataset(split, subset=0):
    images, labels = fashion_mnist_data.load(split, args.data_dir)
    if subset:
        images, labels = images[:subset], labels[:subset]
    return torch.utils.data.TensorDataset(fashion_mnist_data.normalize(images), labels)


def train(epoch):
    model.train()
    # Shuffle differently every epoch (the sampler seeds with the epoch).
    train_sampler.set_epoch(epoch)
    for batch_idx, (data, target) in enumerate(train_loader):
        if args.cuda:
            data, target = data.cuda(), target.cuda()
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
            # len(train_sampler): the images of this rank's shard.
            print("Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                epoch, batch_idx * len(data), len(train_sampler),
                100. * batch_idx / len(train_loader), loss.item()), flush=True)


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def test():
    model.eval()
    test_loss = 0.
    test_accuracy = 0.
    with torch.no_grad():
        for data, target in test_loader:
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.data.max(1, keepdim=True)[1]
            test_accuracy += pred.eq(target.data.view_as(pred)).cpu().float().sum().item()

    # Per-rank means over this rank's shard, then averaged over ranks.
    test_loss /= len(test_sampler)
    test_accuracy /= len(test_sampler)
    test_loss = metric_average(test_loss, "avg_loss")
    test_accuracy = metric_average(test_accuracy, "avg_accuracy")

    # Only the first rank prints.
    if hvd.rank() == 0:
        print("\nTest set: Average loss: {:.4f}, Accuracy: {:.2f}%\n".format(
            test_loss, 100. * test_accuracy), flush=True)


if __name__ == "__main__":
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    hvd.init()
    torch.manual_seed(args.seed)

    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())
        torch.cuda.manual_seed(args.seed)

    # Several ranks share the host's cores: one thread each.
    torch.set_num_threads(1)

    kwargs = {"num_workers": 1, "pin_memory": True} if args.cuda else {}

    train_dataset = dataset("train", args.train_subset)
    # Each rank reads its own shard of the training set.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, sampler=train_sampler, **kwargs)

    test_dataset = dataset("test")
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    test_loader = torch.utils.data.DataLoader(
        test_dataset, batch_size=args.test_batch_size, sampler=test_sampler, **kwargs)

    model = Net()

    # Adasum needs no learning-rate scaling; averaging does.
    lr_scaler = hvd.size() if not args.use_adasum else 1

    if args.cuda:
        model.cuda()
        if args.use_adasum and hvd.nccl_built():
            lr_scaler = hvd.local_size()

    # The global batch grows with the world size, so does the learning rate.
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    # Every rank starts from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Optional gradient compression.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # All-reduce the gradients as backward produces them.
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)

    for epoch in range(1, args.epochs + 1):
        train(epoch)
        test()
