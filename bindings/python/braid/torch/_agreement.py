"""Which gradients one DistributedOptimizer step reduces, agreed by every rank.

Note [Step agreement]
A rank's hooks start the all-reduce of each gradient its backward produces. At step() it must
also take part in the reductions of gradients that other ranks have and it lacks (a layer it
did not use, a sparse embedding it looked nothing up in), or they wait for it. But a
parameter frozen on every rank (requires_grad=False), or one that no rank used, must keep its
gradient as one process keeps it (None stays None), so that momentum and weight decay do not
move it; and which parameters train may change between steps (fine-tuning freezes and
unfreezes layers). No rank can tell alone what the others have, so step() first all-reduces
(max) a small record per parameter: whether this rank has a dense gradient, a sparse one,
whether it froze the parameter, and a sparse gradient's sparse_dim (DDP's
find_unused_parameters all-reduces a bitmap of used parameters the same way). From the
result every rank takes the same decision for each parameter:

- no rank has a gradient: not reduced; its gradient stays as it is on every rank;
- some ranks have one: reduced; a rank without one contributes zeros (dense) or no rows
  (sparse, of the agreed sparse_dim) and receives the average, as the others do;
- a rank froze it while another has a gradient, or some ranks have a sparse gradient and
  others a dense one: the ranks disagree (a change in the middle of a step, or a program
  that differs across ranks). Every rank still submits every reduction of it that some rank
  submitted (from a scratch tensor of zeros), so no rank waits and every name keeps its
  pairing; then all raise the same InvalidArgumentError, naming the parameters and the ranks
  (a second all-reduce, run only then, tells every rank what each rank had).

A max all-reduce also works under join(): a joined rank contributes the identity, 0, as a
rank that has nothing.
"""

import torch

from .._core.errors import InvalidArgumentError

NONE, DENSE, SPARSE, FROZEN = 0, 1, 2, 3  # what one rank has of a parameter's gradient
_FIELDS = 4  # per parameter: has a dense gradient, has a sparse one, froze it, sparse_dim
_LIMIT = 4   # disagreements named in a message (then a count of the rest)


def record(kinds):
    """The uint8 tensor this rank contributes: _FIELDS entries per parameter, from
    ``kinds``, a (code, sparse_dim) pair per parameter."""
    out = [0] * (_FIELDS * len(kinds))
    for i, (code, sparse_dim) in enumerate(kinds):
        if code != NONE:
            out[_FIELDS * i + code - 1] = 1
        out[_FIELDS * i + 3] = sparse_dim
    return torch.tensor(out, dtype=torch.uint8)


class Decision:
    """What every rank does with one parameter this step: ``reduce`` it (``kinds``: the one
    kind, "dense" or "sparse"), skip it (``kinds`` empty), or, when ``conflict``, submit
    every kind in ``kinds`` and fail. ``frozen``: some rank froze it."""

    __slots__ = ("kinds", "sparse_dim", "frozen", "conflict")

    def __init__(self, fields):
        dense, sparse, frozen, sparse_dim = (int(v) for v in fields)
        self.kinds = tuple(k for k, has in (("dense", dense), ("sparse", sparse)) if has)
        self.sparse_dim = sparse_dim
        self.frozen = bool(frozen)
        self.conflict = len(self.kinds) > 1 or (self.frozen and bool(self.kinds))


def decide(agreed):
    """[Decision] per parameter from the max all-reduced records."""
    values = agreed.tolist()
    return [Decision(values[i:i + _FIELDS]) for i in range(0, len(values), _FIELDS)]


def codes_row(kinds, rank, size):
    """This rank's row of the (size, parameters) code matrix whose sum over ranks tells
    every rank what each rank had (only after a disagreement)."""
    out = torch.zeros(size, len(kinds), dtype=torch.uint8)
    out[rank] = torch.tensor([code for code, _ in kinds], dtype=torch.uint8)
    return out


def disagreement(names, decisions, codes):
    """The InvalidArgumentError every rank raises after a disagreement: ``names`` and
    ``decisions`` per parameter, ``codes`` the summed (size, parameters) code matrix."""
    by_code = codes.t().tolist()
    parts = []
    for name, d, row in zip(names, decisions, by_code):
        if not d.conflict:
            continue
        ranks = {c: [r for r, v in enumerate(row) if v == c] for c in (DENSE, SPARSE, FROZEN)}
        if d.frozen:
            parts.append(f"'{name}' has requires_grad=False on rank(s) {ranks[FROZEN]} but a "
                         f"gradient on rank(s) {ranks[DENSE] + ranks[SPARSE]}")
        else:
            parts.append(f"'{name}' has a sparse gradient on rank(s) {ranks[SPARSE]} and a "
                         f"dense one on rank(s) {ranks[DENSE]}")
    more = f"; and {len(parts) - _LIMIT} more" if len(parts) > _LIMIT else ""
    return InvalidArgumentError(
        "DistributedOptimizer: the ranks disagree on the gradients of this step: "
        f"{'; '.join(parts[:_LIMIT])}{more}. Every rank must freeze and unfreeze parameters "
        "(requires_grad) alike, between steps, and produce gradients of one layout; step() "
        "did not update the parameters")
