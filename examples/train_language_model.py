#!/usr/bin/python3
"""Data-parallel training of a word-level LSTM language model on the King James Bible with
braid.torch.

    build/tools/braidrun/braidrun -np 4 /usr/bin/python3 examples/train_language_model.py

A workload where communication dominates: the embedding and the softmax layer are each
vocabulary x 256 (10,000 words: 5.7M parameters, 22.6 MB of float32 gradients per step),
against little computation per token, so on a rate-limited link most of a step is the
all-reduce (the case PowerSGD's paper found its wall-clock gains in).

Horovod's recipe, as examples/train_fashion_mnist.py: each rank reads its own contiguous
shard of the training stream (``--batch-size`` rows of ``--bptt`` tokens per step, truncated
backpropagation through time, the LSTM's state carried from step to step); the learning rate
is ``--lr`` times the world size; rank 0's initial weights are broadcast;
``DistributedOptimizer`` all-reduces the gradients, which are then clipped to a global norm of
``--clip`` (Zaremba et al. 2014's recipe) before plain SGD applies them. Validation
perplexity, exp of the mean cross-entropy per token over the held-out chapters (split over
ranks and summed exactly), after every epoch and every ``--eval-every`` steps.

Model: embedding 256 - LSTM 256 (one layer) - dropout - linear to the vocabulary, float32.
Data: examples/bible_data.py (Debian's bible-kjv). Reproducible: ``--seed`` fixes the initial
weights, so every ``--compression`` method starts from the same weights and reads the same
tokens. Each rank uses one thread.

Output: the validation perplexity as it goes, then the wall time, the time to
``--target-perplexity``, the gradient bytes on the wire against those of an uncompressed
all-reduce; ``--json PATH`` writes the same from rank 0 (the Fashion-MNIST example's fields,
with perplexities for accuracies).
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
import bible_data  # noqa: E402
from train_fashion_mnist import (non_negative_int, positive_int, progress,  # noqa: E402
                                 rank0_tensor_bytes, wire_bytes)

import braid.torch as hvd  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=positive_int, default=1)
    p.add_argument("--max-steps", type=non_negative_int, default=0,
                   help="stop after this many steps (0: run every epoch to its end)")
    p.add_argument("--batch-size", type=positive_int, default=20, help="rows per rank per step")
    p.add_argument("--bptt", type=positive_int, default=35, help="tokens per row per step")
    p.add_argument("--vocab", type=positive_int, default=10000, help="vocabulary size")
    p.add_argument("--embedding", type=positive_int, default=256)
    p.add_argument("--hidden", type=positive_int, default=256)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=5.0,
                   help="SGD learning rate for one rank (scaled by the world size)")
    p.add_argument("--clip", type=float, default=0.25,
                   help="global gradient norm the averaged gradients are clipped to")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compression", default=None,
                   help="gradient compression spec (fp16, fp4, 'powersgd:rank=2', ...); "
                        "default: BRAID_COMPRESSION, else none")
    p.add_argument("--target-perplexity", type=float, default=120.0,
                   help="report the time until the validation perplexity first falls to this")
    p.add_argument("--eval-every", type=non_negative_int, default=50,
                   help="also evaluate every this many steps (0: after each epoch only)")
    p.add_argument("--valid-tokens", type=non_negative_int, default=0,
                   help="evaluate on the first N validation tokens only (0: all 46,116)")
    p.add_argument("--json", default=None, help="rank 0 writes the results here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


class LanguageModel(nn.Module):
    def __init__(self, vocab, embedding, hidden, dropout):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embedding)
        self.lstm = nn.LSTM(embedding, hidden)
        self.drop = nn.Dropout(dropout)
        self.decoder = nn.Linear(hidden, vocab)
        # Zaremba et al.'s initialisation: uniform in [-0.1, 0.1].
        for p in self.parameters():
            nn.init.uniform_(p, -0.1, 0.1)

    def forward(self, tokens, state=None):
        """tokens: int64 [T, B] -> logits float32 [T, B, vocab], the LSTM's state."""
        out, state = self.lstm(self.drop(self.embedding(tokens)), state)
        return self.decoder(self.drop(out)), state


def detach(state):
    return tuple(s.detach() for s in state)


def token_loss(logits, targets, reduction="mean"):
    """Cross-entropy of logits [T, B, vocab] against int64 targets [T, B], over every token."""
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1),
                           reduction=reduction)


def validation_sums(model, valid, bptt, rank, size):
    """This rank's part of the validation score: the summed cross-entropy (nats) and the
    token count over a contiguous size-th of ``valid`` (int64 [N]), in 10 rows of ``bptt``
    tokens, the LSTM's state carried along. Summed over ranks, exp(loss / count) is the
    perplexity of the whole of ``valid`` (but for at most 10 x size tokens left over)."""
    was_training = model.training
    model.eval()
    n = len(valid) // size
    data = bible_data.batchify(valid[rank * n:(rank + 1) * n], 10)
    loss, count, state = 0.0, 0, None
    with torch.no_grad():
        for i in range(0, len(data) - 1, bptt):
            x, y = bible_data.bptt_batch(data, i, bptt)
            out, state = model(x, state)
            loss += float(token_loss(out, y, reduction="sum"))
            count += y.numel()
    model.train(was_training)
    return loss, count


def evaluate(model, valid, args, rank, size):
    """Validation perplexity over the held-out tokens (the first ``--valid-tokens``), the
    ranks' sums added up exactly (float64, uncompressed)."""
    tokens = valid[:args.valid_tokens] if args.valid_tokens else valid
    totals = hvd.allreduce(
        torch.tensor(validation_sums(model, tokens, args.bptt, rank, size), dtype=torch.float64),
        name="eval.totals", op=hvd.Sum, compression="none")
    return math.exp(float(totals[0] / totals[1]))


def main(argv=None):
    args = parse_args(argv)
    hvd.init()
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed)
    # Every rank checks the same settings, so every rank stops with the same message.
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        sys.exit(f"train_language_model: --json {args.json}: no such directory")
    if args.valid_tokens and args.valid_tokens < 20 * size:
        sys.exit(f"train_language_model: --valid-tokens {args.valid_tokens} is too few to "
                 f"score: each of {size} ranks needs at least 20 (10 rows of 2)")

    corpus = bible_data.Corpus(args.vocab)
    n = len(corpus.train) // size  # this rank's contiguous shard
    data = bible_data.batchify(corpus.train[rank * n:(rank + 1) * n], args.batch_size)
    steps = (len(data) - 1) // args.bptt
    if steps < 1:
        sys.exit(f"train_language_model: a rank's {n} training tokens make no step of "
                 f"--batch-size {args.batch_size} rows x --bptt {args.bptt} tokens")
    total_steps = steps * args.epochs
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)

    model = LanguageModel(len(corpus.words), args.embedding, args.hidden, args.dropout)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * size)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=args.compression)
    method = args.compression or os.environ.get("BRAID_COMPRESSION") or "none"
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"training on {len(corpus.train)} tokens ({len(corpus.words)} words), {size} "
              f"ranks x {args.batch_size} x {args.bptt} tokens per step, {params} parameters, "
              f"lr {args.lr * size:g}, compression {method}", flush=True)

    history, time_to_target, step = [], None, 0
    start = time.perf_counter()

    def record(epoch, train_loss):
        nonlocal time_to_target
        ppl = evaluate(model, corpus.valid, args, rank, size)
        elapsed = time.perf_counter() - start
        if time_to_target is None and ppl <= args.target_perplexity:
            time_to_target = elapsed
        history.append({"epoch": epoch, "step": step, "train_loss": train_loss,
                        "valid_perplexity": ppl, "elapsed_s": elapsed})
        if rank == 0:
            print(f"step {step} (epoch {epoch}): train loss {train_loss:.3f}  validation "
                  f"perplexity {ppl:.1f}  ({elapsed:.1f} s)", flush=True)

    for epoch in range(1, args.epochs + 1):
        state, total, counted = None, 0.0, 0
        for s in progress(steps, epoch, rank == 0 and not args.no_progress):
            if step >= total_steps:
                break
            x, y = bible_data.bptt_batch(data, s * args.bptt, args.bptt)
            opt.zero_grad()
            out, state = model(x, state)
            state = detach(state)
            loss = token_loss(out, y)
            loss.backward()
            opt.synchronize()  # the averaged gradients, then clip them (as Horovod's recipe)
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            with opt.skip_synchronize():
                opt.step()
            total, counted, step = total + float(loss), counted + 1, step + 1
            if args.eval_every and step % args.eval_every == 0 and step < total_steps:
                record(epoch, total / counted)
        train_loss = float(hvd.allreduce(torch.tensor(total / max(counted, 1)),
                                         name="train.loss", compression="none"))
        record(epoch, train_loss)
        if step >= total_steps:
            break
    wall = time.perf_counter() - start
    transport, uncompressed, payload, reference = wire_bytes()
    ratio = uncompressed / payload if payload else 0.0
    wire_ratio = reference / transport if transport else 0.0
    if rank == 0:
        target = f"{time_to_target:.1f} s" if time_to_target is not None else "not reached"
        print(f"final validation perplexity {history[-1]['valid_perplexity']:.1f}  wall time "
              f"{wall:.1f} s  time to perplexity {args.target_perplexity:g}: {target}",
              flush=True)
        print(f"gradient bytes on the wire (all ranks): {transport / 1e6:.1f} MB, against "
              f"{reference / 1e6:.1f} MB for a bandwidth-optimal uncompressed all-reduce: "
              f"wire ratio {wire_ratio:.2f}x (payload ratio {ratio:.2f}x)", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": size, "epochs": args.epochs, "steps": step,
                           "seed": args.seed, "batch_size_per_rank": args.batch_size,
                           "bptt": args.bptt, "lr": args.lr * size, "compression": method,
                           "vocab": len(corpus.words), "train_tokens": len(corpus.train),
                           "valid_perplexity": history[-1]["valid_perplexity"],
                           "target_perplexity": args.target_perplexity,
                           "time_to_target_s": time_to_target, "wall_time_s": wall,
                           "transport_bytes": transport, "uncompressed_bytes": uncompressed,
                           "payload_bytes": payload, "payload_ratio": ratio,
                           "reference_transport_bytes": reference, "wire_ratio": wire_ratio,
                           "tensors": rank0_tensor_bytes(), "history": history}, f, indent=2)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
