"""DistributedOptimizer: data-parallel training with any torch.optim optimizer.

The wrapper (Horovod's design) registers a hook on every parameter's gradient accumulator.
The moment backward has accumulated a parameter's gradient, the hook starts that gradient's
all-reduce, so communication overlaps the rest of backward (the runtime fuses the tensors
that arrive within one cycle into buckets). ``step()`` waits for every all-reduce, then runs
the wrapped optimizer's update on the averaged gradients.
"""

import contextlib
import functools
import math
import json
import numbers
import os
import warnings
import weakref

import torch

from .._core import checks as _checks, compression as _core_compression, runtime as _runtime
from .._core.errors import Average, BraidError as _BraidError, FailedPreconditionError, \
    InvalidArgumentError
from . import _agreement, _naming, mpi_ops
from ._handles import CODES as _DTYPE_CODES, JOB_DEFAULT as _JOB_DEFAULT, \
    check_op as _check_op, check_process_set as _check_process_set
from .compression import Compressor, plan_spec, resolve


class _DistributedMixin:
    """Put in front of the wrapped optimizer's class (see DistributedOptimizer)."""

    def __init__(self, param_groups, state, defaults, named_parameters, compression,
                 backward_passes_per_step, op, gradient_predivide_factor, sparse_as_dense,
                 groups, gradient_as_bucket_view, process_set=None):
        # Note [Process sets]: every reduction of this optimizer runs in its set (None: the
        # whole world); an average divides by the set's size.
        self._process_set = process_set
        self._wrapped = False  # add_param_group() registers parameters once this is True
        super().__init__(param_groups)
        # The wrapped optimizer's defaults (its lr, ...), not those of its class's signature:
        # add_param_group() fills a group's missing options from them.
        self.defaults = dict(defaults)
        self.state.update(state)  # keep what the wrapped optimizer had (a loaded checkpoint)
        spec, self._framework_compressor = resolve(compression, "DistributedOptimizer")
        self._spec = spec
        self._compression = None if spec is None else Compressor(spec)
        # Compression per layer: a plan (given here, or the job's BRAID_COMPRESSION) matches
        # parameter names, so it is resolved here per parameter, not by the runtime on the
        # gradient's name (which carries this optimizer's prefix).
        plan = spec
        if spec is None and self._framework_compressor is None:
            plan = _job_default_compression()
        self._plan = plan if plan and plan.startswith("{") else None
        self._plan_specs = {}  # (parameter name, shape, dtype) -> its Compressor
        self._op = op
        self._predivide = float(gradient_predivide_factor)
        self._sparse_as_dense = bool(sparse_as_dense)
        # _name_of_id: every named parameter (None without names), also those the optimizer
        # does not train yet: a group added later takes its names from there.
        self._names, self._name_of_id, self._named_pairs = _naming.parameter_names(
            self.param_groups, named_parameters)
        self.backward_passes_per_step = int(backward_passes_per_step)
        self._passes = {p: 0 for p in self._names}  # backward passes since the last step
        self._handles = {}   # parameter -> (kind, handle(s), context) of its running reduction
        self._scratch = []   # reductions submitted only to pair with other ranks' (Note [Step
                             # agreement] in _agreement.py): waited for, never delivered
        self._groups = self._check_groups(groups, spec)
        self._trainable = []   # the parameters with requires_grad when groups were planned
        self._group_of = {}    # parameter -> its group's list (of trainable parameters)
        self._waiting = set()  # grouped parameters whose gradient waits for the rest
        self._grad_accs = []
        self._hooked = set()   # ids of the parameters whose accumulator has our hook
        self._frozen_names = set()  # names agreed frozen (their compression state forgotten)
        self._single = self._set_size() == 1
        self._bucket_view = bool(gradient_as_bucket_view) and not self._single
        self._synchronized = False
        self._should_synchronize = True
        self._views = {}       # parameter -> its gradient's view (gradient_as_bucket_view)
        self._flat = []        # the flat buffers the views lie in, one per dtype
        self._started = []     # first step: the views' parameters in the order they started
        self._recording = False  # recording _started (until the first step synchronizes)
        self._prefix = _naming.claim_prefix(self, set(self._names.values()))
        # The all-reduce of the step's agreement: named after this optimizer's first
        # parameter, whose name (prefix included) no other live optimizer uses.
        first = self.param_groups[0]["params"][0]
        self._agreement_name = f"step_agreement.{self._prefix}{self._names[first]}"
        # One rank has nobody to talk to: no hooks, step() is the wrapped optimizer's.
        if self._bucket_view:
            self._allocate_bucket_views()
            self._recording = True
        self._track_trainable()
        self._wrapped = True

    # -- set-up --------------------------------------------------------------------------

    def _params(self):
        """Every parameter of the optimizer, in its order (the same on every rank)."""
        return [p for g in self.param_groups for p in g["params"]]

    def _check_groups(self, groups, spec):
        """``groups`` checked (Horovod's): an integer k >= 0, or lists of the optimizer's
        parameters (each in one list at most), each list in the optimizer's order. None:
        1 for a sparsifier that selects over whole buckets, 0 otherwise."""
        if groups is None:
            if spec is None and self._framework_compressor is None:
                spec = _job_default_compression()
            groups = 1 if _selects_over_buckets(spec) else 0
        if isinstance(groups, bool) or not isinstance(groups, (int, list, tuple)):
            raise InvalidArgumentError("DistributedOptimizer: groups must be None, an integer "
                                       f">= 0 or a list of lists of parameters, got {groups!r}")
        if isinstance(groups, int):
            if groups < 0:
                raise InvalidArgumentError(f"DistributedOptimizer: groups must be >= 0, got "
                                           f"{groups}")
            return groups
        params = self._params()
        known = {id(p): p for p in params}
        position = {id(p): i for i, p in enumerate(params)}
        lists, seen = [], set()
        for g in groups:
            members = list(g)
            for p in members:
                if id(p) not in known:
                    raise InvalidArgumentError(
                        "DistributedOptimizer: groups name a tensor that is not a parameter "
                        f"of the optimizer, shape {tuple(getattr(p, 'shape', ()))}")
                if id(p) in seen:
                    raise InvalidArgumentError(
                        f"DistributedOptimizer: parameter '{self._names[known[id(p)]]}' "
                        "is in more than one group")
                seen.add(id(p))
            # Start order follows the optimizer's order, identical on every rank.
            lists.append([known[i] for i in sorted((id(p) for p in members),
                                                   key=position.get)])
        return lists

    def _plan_groups(self):
        """{parameter: the list of parameters whose all-reduces start together}, over the
        trainable parameters (a frozen one would hold its group back): a group's gradients
        go to the runtime as one group (braid._core.runtime.group), so they travel fused in one
        bucket."""
        params, groups = self._trainable, self._groups
        if isinstance(groups, int):
            k = min(groups, len(params))
            lists = [params[i * len(params) // k:(i + 1) * len(params) // k]
                     for i in range(k)] if k else []
        else:
            trainable = {id(p) for p in params}
            lists = [[p for p in g if id(p) in trainable] for g in groups]
        return {p: lst for lst in lists if len(lst) > 1 for p in lst}

    def _track_trainable(self):
        """Between steps: follows the parameters' requires_grad. A parameter that trains now
        gets its hook (and its bucket view) if it has none yet, and the groups are planned
        again over the parameters that train. A frozen parameter keeps its hook: backward
        does not reach it, so it never fires."""
        trainable = [p for p in self._params() if p.requires_grad]
        if [id(p) for p in trainable] == [id(p) for p in self._trainable]:
            return
        self._trainable = trainable
        self._group_of = self._plan_groups()
        new = [p for p in trainable if id(p) not in self._hooked]
        if self._single or not new:
            return
        if self._bucket_view:
            fresh = [p for p in new if p.layout == torch.strided and p not in self._views]
            if fresh:
                self._allocate_bucket_views(list(self._views) + fresh[::-1])
        self._register_hooks(new)

    def _allocate_bucket_views(self, order=None):
        """Makes every parameter's ``.grad`` a view into one flat buffer per (dtype,
        device), laid out in ``order``: at first the reverse of the optimizer's order (the
        order backward produces the gradients in, as DDP assumes), then, after the first
        step, the order their all-reduces started in (as DDP rebuilds its buckets). So the
        gradients the runtime fuses into one bucket lie back to back in the bucket's order
        and it reduces them where they are (no copy into its fusion buffer and back). A
        gradient that exists already is copied into its view; a frozen parameter without a
        gradient keeps None (its view waits for it: _attach_view)."""
        if order is None:
            order = [p for p in reversed(self._params())
                     if p.requires_grad and p.layout == torch.strided]
        by_kind = {}
        for p in order:
            by_kind.setdefault((p.dtype, p.device), []).append(p)
        self._views, self._flat = {}, []
        for (dtype, device), params in by_kind.items():
            flat = torch.zeros(sum(p.numel() for p in params), dtype=dtype, device=device)
            offset = 0
            for p in params:
                view = flat[offset:offset + p.numel()].view(p.shape)
                offset += p.numel()
                if p.grad is not None:
                    with torch.no_grad():
                        view.copy_(p.grad.to_dense() if p.grad.is_sparse else p.grad)
                if p.grad is not None or p.requires_grad:
                    p.grad = view
                self._views[p] = view
            self._flat.append(flat)

    def _relayout_bucket_views(self):
        """After the first step: lays the views out again in the order the all-reduces
        started in, when that differs from the current layout (parameters that never
        started keep their relative order, after the others)."""
        started, self._started, self._recording = self._started, [], False
        current = list(self._views)
        seen = {id(p) for p in started}
        order = started + [p for p in current if id(p) not in seen]
        if [id(p) for p in order] != [id(p) for p in current]:
            self._allocate_bucket_views(order)

    def _attach_view(self, p):
        """Puts p's gradient back into its bucket view when something replaced ``p.grad``
        (set it to None, or to a new tensor), copying the values over."""
        view = self._views.get(p)
        grad = p.grad
        if view is None or (grad is not None and not grad.is_sparse and
                            grad.data_ptr() == view.data_ptr()):
            return
        with torch.no_grad():
            if grad is None:
                view.zero_()
            elif grad.is_sparse:
                return  # a sparse gradient takes its own path (sparse_as_dense=False)
            else:
                self._check_replacement(p, grad, view, "(gradient_as_bucket_view)")
                view.copy_(grad)
        p.grad = view

    def _register_hooks(self, params):
        for p in params:
            # The gradient accumulator of p (an AccumulateGrad node): its hooks run once the
            # pass's gradient has been added to p.grad. (Reached through a graph, which
            # zero_grad() under torch.no_grad() would not build.)
            with torch.enable_grad():
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._make_hook(p))
            self._grad_accs.append(acc)  # the node lives as long as someone holds it
            self._hooked.add(id(p))

    def _make_hook(self, p):
        # The hook holds the optimizer weakly: the accumulator node (which the parameter keeps
        # while anyone holds it) must not keep a discarded DistributedOptimizer alive and
        # all-reducing; once the optimizer is gone, its hooks do nothing.
        me = weakref.ref(self)

        def hook(*_):
            opt = me()
            if opt is not None:
                opt._on_gradient(p)
        return hook

    # -- the hook and the reductions -----------------------------------------------------

    def _on_gradient(self, p):
        passes = self._passes[p] + 1
        if passes > self.backward_passes_per_step or p in self._handles:
            raise FailedPreconditionError(
                f"DistributedOptimizer: the gradient of '{self._names[p]}' was computed "
                f"{passes} times since the last step()/synchronize(), but "
                f"backward_passes_per_step={self.backward_passes_per_step}: call step() after "
                "that many backward passes, or raise backward_passes_per_step to accumulate "
                "more passes locally")
        if p.grad is not None and p.grad.requires_grad:
            raise InvalidArgumentError(
                f"DistributedOptimizer: the gradient of '{self._names[p]}' requires grad "
                "(backward(create_graph=True)), which DistributedOptimizer does not support")
        self._passes[p] = passes
        # A backward pass after synchronize() (a step skipped, say): step() reduces these
        # new gradients once; nothing is all-reduced twice.
        self._synchronized = False
        if passes < self.backward_passes_per_step:
            return
        group = self._group_of.get(p)
        if group is None:
            self._handles[p] = self._start(p)
            return
        self._waiting.add(p)
        if all(q in self._waiting for q in group):
            self._start_group(group)

    def _start_group(self, members):
        """Starts the all-reduces of `members` not started yet, as one group."""
        with _runtime.group():
            for q in members:
                if q not in self._handles:
                    self._waiting.discard(q)
                    self._handles[q] = self._start(q)

    def _start(self, p):
        """Starts the reduction of p.grad (zeros when this rank has none: a parameter that
        other ranks have a gradient of still takes part, so they do not wait for it)."""
        if self._views:
            self._attach_view(p)
            if self._recording and p in self._views:
                self._started.append(p)
        if p.grad is None:
            p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        name = self._reduction_name(p)
        grad = p.grad
        if grad.is_sparse:
            if not self._sparse_as_dense:
                return self._start_sparse(p, grad, name)
            grad = p.grad = grad.to_dense()
        return self._start_dense(grad, name, self._names[p])

    def _reduction_name(self, p):
        return _naming.ALLREDUCE_PREFIX + self._prefix + self._names[p]

    def _plan_compression(self, grad, param_name):
        """The Compressor the plan gives the parameter ``param_name``'s gradient (a
        PlanChoice, whose pattern the all-reduce carries to the statistics)."""
        key = (param_name, tuple(grad.shape), grad.dtype)
        c = self._plan_specs.get(key)
        if c is None:
            code = _DTYPE_CODES.get(grad.dtype)
            c = Compressor("none") if code is None else plan_spec(
                self._plan, param_name, list(grad.shape), code, self._op)
            self._plan_specs[key] = c
        return c

    def _start_dense(self, grad, name, param_name):
        """Starts the all-reduce of the dense ``grad`` (of the parameter ``param_name``)
        under ``name``."""
        pre, post = 1.0, 1.0
        if self._op == Average and self._predivide != 1.0:
            pre, post = 1.0 / self._predivide, self._predivide
        fc = self._framework_compressor
        if fc is not None:
            compressed, ctx = fc.compress(grad)
            h = mpi_ops.allreduce_async_(compressed, name=name, op=self._op, prescale_factor=pre,
                                         postscale_factor=post, compression="none",
                                         process_set=self._process_set)
            return ("framework", h, ctx)
        if self._plan is not None:
            compression = self._plan_compression(grad, param_name)
        else:
            compression = _JOB_DEFAULT if self._compression is None else self._compression
        h = mpi_ops.allreduce_async_(grad, name=name, op=self._op, prescale_factor=pre,
                                     postscale_factor=post, compression=compression,
                                     process_set=self._process_set)
        return ("dense", h, grad)  # grad: the tensor reduced in place

    def _start_sparse(self, p, grad, name):
        if self._op not in (Average, mpi_ops.Sum):
            raise InvalidArgumentError(
                f"DistributedOptimizer: sparse gradient of '{self._names[p]}' with op "
                f"{self._op!r}: sparse gradients support Average and Sum only (or pass "
                "sparse_as_dense=True)")
        g = grad.coalesce()
        hi = mpi_ops.allgather_async(g.indices().t().contiguous(), name=name + ".indices",
                                     process_set=self._process_set)
        hv = mpi_ops.allgather_async(g.values().contiguous(), name=name + ".values",
                                     process_set=self._process_set)
        return ("sparse", (hi, hv), (g.shape, g.sparse_dim()))

    def _finish(self, p, kind, handle, ctx):
        if kind == "dense":
            mpi_ops.synchronize(handle)  # reduced in place, in ctx
            self._deliver(p, ctx)
        elif kind == "framework":
            out = self._framework_compressor.decompress(mpi_ops.synchronize(handle), ctx)
            with torch.no_grad():
                self._deliver(p, out)
        else:
            indices = mpi_ops.synchronize(handle[0]).t()
            values = mpi_ops.synchronize(handle[1])
            if self._op == Average:
                values = values / self._set_size()
            p.grad = torch.sparse_coo_tensor(indices, values, ctx[0]).coalesce()

    def _check_replacement(self, p, grad, like, when):
        """Raises InvalidArgumentError naming p unless the tensor that replaced ``p.grad``
        (``grad``) can hold ``like`` (same shape, dtype, device, dense)."""
        if (grad.is_sparse or grad.shape != like.shape or grad.dtype != like.dtype or
                grad.device != like.device):
            raise InvalidArgumentError(
                f"DistributedOptimizer: the gradient of '{self._names[p]}' was replaced {when} "
                f"by a tensor of shape {tuple(grad.shape)}, dtype {grad.dtype}"
                f"{', sparse' if grad.is_sparse else ''}, device {grad.device}; the gradient "
                f"has shape {tuple(like.shape)}, dtype {like.dtype}, device {like.device}: a "
                "replaced gradient must keep its shape, dtype, device and (dense) layout")

    def _deliver(self, p, result):
        """Makes ``p.grad`` hold ``result`` (the reduced gradient, a dense tensor). When
        ``p.grad`` is still the tensor the reduction started from, nothing to do; when
        something replaced it after the hook started the reduction (``p.grad = p.grad / k``),
        the result goes into the replacement (copied, as Horovod's ``p.grad.set_(output)``
        makes the replacement hold it), or, with gradient_as_bucket_view, ``p.grad`` returns
        to its bucket view. A replacement of another shape, dtype or layout raises
        InvalidArgumentError naming the parameter (never a silently local gradient)."""
        grad = p.grad
        if grad is result:
            return
        if grad is None:
            p.grad = result
            return
        self._check_replacement(p, grad, result, "between backward() and "
                                "step()/synchronize()")
        view = self._views.get(p)
        if view is not None and view is result:
            p.grad = view  # as _attach_view does: the gradient lives in its bucket view
            return
        with torch.no_grad():
            grad.copy_(result)

    # -- Horovod's optimizer API ---------------------------------------------------------

    def synchronize(self):
        """Waits for the gradients' all-reduces; after it, every ``p.grad`` that some rank
        has a gradient for holds the average over ranks (or the ``op`` result).

        The ranks first agree on which gradients the step reduces (a small all-reduce):
        those some rank has (Note [Step agreement] in _agreement.py). A rank without one of
        them (a layer it did not use, fewer backward passes than
        ``backward_passes_per_step``) contributes zeros, or no rows to a sparse gradient.
        A parameter no rank has a gradient for (frozen with ``requires_grad=False``, or
        unused everywhere) is not reduced: its ``p.grad`` stays as it is (None stays None),
        as in one process. Raises the first collective's error (after waiting for all),
        else InvalidArgumentError, on every rank, naming the parameters and ranks, when a
        rank froze a parameter another has a gradient for, or the ranks' gradients of one
        parameter are sparse on some and dense on others. Call ``step()`` inside
        ``skip_synchronize()`` afterwards.
        """
        if self._single:
            self._synchronized = True
            return
        try:
            error = self._start_agreed()
        except _BraidError as e:  # the agreement itself failed (a lost peer, ...)
            error = e
        error = self._finish_all() or error
        self._waiting.clear()
        for p in self._passes:
            self._passes[p] = 0
        if error is None and self._recording:
            self._relayout_bucket_views()
        self._track_trainable()
        if error is not None:
            raise error
        self._synchronized = True

    def _local_kind(self, p):
        """(code, sparse_dim): what this rank has of p's gradient this step (_agreement)."""
        entry = self._handles.get(p)
        if entry is not None:
            return (_agreement.SPARSE, entry[2][1]) if entry[0] == "sparse" else (
                _agreement.DENSE, 0)
        computed = p in self._waiting or self._passes[p] > 0  # by a backward pass of this step
        if not computed and not p.requires_grad:
            return _agreement.FROZEN, 0
        g = p.grad
        if g is None:
            return _agreement.NONE, 0
        if g.is_sparse and not self._sparse_as_dense:
            # An emptied sparse gradient (zero_grad() without set_to_none) has nothing, and
            # not even its sparse_dim any more.
            return (_agreement.SPARSE, g.sparse_dim()) if g._nnz() else (_agreement.NONE, 0)
        return _agreement.DENSE, 0

    def _set_size(self):
        return _runtime.size() if self._process_set is None else self._process_set.size()

    def _set_rank(self):
        return _runtime.rank() if self._process_set is None else self._process_set.rank()

    def _start_agreed(self):
        """Agrees with the other ranks on what this step reduces (Note [Step agreement]),
        starts what this rank has not started of it, and returns the InvalidArgumentError of
        a disagreement (None when the ranks agree)."""
        params = self._params()
        kinds = [self._local_kind(p) for p in params]
        agreed = mpi_ops.synchronize(mpi_ops.allreduce_async_(
            _agreement.record(kinds), name=self._agreement_name, op=mpi_ops.Max,
            compression="none", process_set=self._process_set))
        decisions = _agreement.decide(agreed)
        todo, frozen = {}, []
        for p, d in zip(params, decisions):
            if d.conflict:
                self._pair(p, d)
            elif d.kinds:
                self._frozen_names.discard(self._reduction_name(p))
                if p not in self._handles:
                    todo[p] = functools.partial(self._start_as, p, d.kinds[0], d.sparse_dim)
            elif d.frozen:
                frozen.append(p)
        self._start_all(todo)
        self._forget_frozen(frozen)
        if not any(d.conflict for d in decisions):
            return None
        codes = mpi_ops.synchronize(mpi_ops.allreduce_async_(
            _agreement.codes_row(kinds, self._set_rank(), self._set_size()),
            name=self._agreement_name + ".ranks", op=mpi_ops.Sum, compression="none",
            process_set=self._process_set))
        return _agreement.disagreement([self._names[p] for p in params], decisions, codes)

    def _start_as(self, p, kind, sparse_dim):
        """Starts p's reduction as the agreed ``kind``; this rank's missing or emptied
        gradient becomes zeros (dense) or no rows of the agreed ``sparse_dim`` (sparse)."""
        g = p.grad
        empty = g is not None and g.is_sparse and not g._nnz()
        if kind == "sparse" and (g is None or empty):
            p.grad = _empty_sparse(p, sparse_dim)
            return self._start_sparse(p, p.grad, self._reduction_name(p))
        if kind == "dense" and empty:
            p.grad = None  # the others' gradients are dense: so is the average
        return self._start(p)

    def _start_all(self, todo):
        """Starts ``todo`` ({parameter: a function starting it}), a group's members (those
        in ``todo``) together."""
        for p, start in todo.items():
            group = self._group_of.get(p)
            if group is None:
                self._handles[p] = start()
            elif p not in self._handles:
                with _runtime.group():
                    for q in group:
                        if q in todo and q not in self._handles:
                            self._waiting.discard(q)
                            self._handles[q] = todo[q]()

    def _pair(self, p, d):
        """After a disagreement on p: submits, from scratch tensors, every reduction of p
        some rank submitted and this one did not (Note [Step agreement])."""
        entry = self._handles.get(p)
        mine = None if entry is None else ("sparse" if entry[0] == "sparse" else "dense")
        name = self._reduction_name(p)
        for kind in d.kinds:
            if kind == mine:
                continue
            if kind == "dense":
                zeros = torch.zeros_like(p, memory_format=torch.contiguous_format)
                self._scratch.append(self._start_dense(zeros, name, self._names[p]))
            else:
                self._scratch.append(self._start_sparse(p, _empty_sparse(p, d.sparse_dim),
                                                        name))

    def _forget_frozen(self, params):
        """Parameters every rank agreed frozen this step: the runtime forgets their
        compression state (residuals, PowerSGD's Q) once, at the same step on every rank,
        so a layer unfrozen later starts afresh, as a new layer would, instead of receiving
        a residual from before it was frozen."""
        names = [n for n in map(self._reduction_name, params) if n not in self._frozen_names]
        if names:
            self._frozen_names.update(names)
            _core_compression.forget_compression_state(names)

    def _finish_all(self):
        """Waits for every reduction of the step and delivers the results; returns the
        first collective's error (None when all succeeded)."""
        error = None
        for p, (kind, handle, ctx) in list(self._handles.items()):
            try:
                self._finish(p, kind, handle, ctx)
            except _BraidError as e:
                error = error or e
        self._handles.clear()
        for _, handle, _ in self._scratch:  # their results go nowhere
            for h in handle if isinstance(handle, tuple) else (handle,):
                try:
                    mpi_ops.synchronize(h)
                except _BraidError as e:
                    error = error or e
        self._scratch.clear()
        return error

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Within it, ``step()`` does not synchronize (use after calling ``synchronize()``,
        e.g. to clip the averaged gradients before the update)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """Synchronizes (unless inside ``skip_synchronize()``), then updates the parameters.

        A ``closure`` is evaluated once, before the synchronization (so its backward pass is
        the one reduced); optimizers that call it several times per step (LBFGS) are not
        supported.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called after optimizer.synchronize() without "
                              "optimizer.skip_synchronize(): the gradients are all-reduced "
                              "twice", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        super().step()
        return loss

    def zero_grad(self, set_to_none=False):
        """Clears the gradients (and takes note of the parameters frozen or unfrozen since
        the last step); raises FailedPreconditionError between ``backward()`` and
        ``step()``/``synchronize()``, where the gradients are being accumulated or
        all-reduced."""
        pending = [self._names[p] for p, n in self._passes.items() if n > 0]
        if pending:
            raise FailedPreconditionError(
                "DistributedOptimizer: zero_grad() was called after backward() and before "
                f"step() or synchronize(), while the gradients of {len(pending)} parameter(s) "
                f"(e.g. '{pending[0]}') are being accumulated or all-reduced: clearing them "
                "now would lose them or race with the all-reduce. Call zero_grad() before "
                "backward() or after step(); to drop this backward pass's gradients, call "
                "synchronize() first (their all-reduce, which the other ranks' step pairs "
                "with, completes), then zero_grad().")
        self._track_trainable()
        if self._views:
            # The gradients stay views into the flat buffers (set_to_none would detach them):
            # a replaced gradient is simply dropped for its zeroed view. But a frozen
            # parameter's gradient is None with set_to_none, as torch makes it, so that
            # momentum and weight decay do not move it.
            for p, view in self._views.items():
                p.grad = None if set_to_none and not p.requires_grad else view
            for flat in self._flat:
                flat.zero_()
            return None
        return super().zero_grad(set_to_none)

    def set_backward_passes_per_step(self, passes):
        """Changes ``backward_passes_per_step`` (between steps only)."""
        if self._handles or any(self._passes.values()):
            raise FailedPreconditionError("DistributedOptimizer: set_backward_passes_per_step() "
                                          "between backward() and step()")
        self.backward_passes_per_step = _checks.check_int(
            "set_backward_passes_per_step", "backward_passes_per_step", passes, 1, 1 << 31)

    def add_param_group(self, param_group):
        """The wrapped optimizer's ``add_param_group`` (between steps only), and the new
        parameters' gradients are all-reduced from then on like the others'.

        Options the group leaves out come from the wrapped optimizer's defaults. Names of
        the new parameters: ``param_group["named_parameters"]`` ((name, parameter) pairs,
        taken out of the group) when given; else the ``named_parameters`` given at
        construction (``model.named_parameters()`` names a layer that was frozen then);
        else, for an optimizer constructed without names, ``"param.<group>.<i>"``. An
        optimizer constructed with names raises InvalidArgumentError for a new parameter
        with none, and for a name already in use.
        """
        if not getattr(self, "_wrapped", False):  # the base class's __init__ adds its groups
            return super().add_param_group(param_group)
        if self._handles or any(self._passes.values()):
            raise FailedPreconditionError("DistributedOptimizer: add_param_group() between "
                                          "backward() and step()")
        group = dict(param_group) if isinstance(param_group, dict) else param_group
        named = group.pop("named_parameters", None) if isinstance(group, dict) else None
        known = {id(p) for g in self.param_groups for p in g["params"]}
        super().add_param_group(group)
        new = [p for p in self.param_groups[-1]["params"] if id(p) not in known]
        try:
            names = _naming.added_names(self, new, named, len(self.param_groups) - 1)
        except InvalidArgumentError:
            self.param_groups.pop()
            raise
        self._names.update(names)
        _naming.update_names(self)
        for p in new:
            self._passes[p] = 0
        self._track_trainable()

    def load_state_dict(self, state_dict):
        """The wrapped optimizer's ``load_state_dict`` (between steps only)."""
        if self._handles or any(self._passes.values()):
            raise FailedPreconditionError("DistributedOptimizer: load_state_dict() between "
                                          "backward() and step()")
        self._synchronized = False
        return super().load_state_dict(state_dict)


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False, process_set=None,
                         gradient_as_bucket_view=False):
    """Wraps ``optimizer`` (any ``torch.optim.Optimizer``) for data-parallel training.

    Returns an optimizer of a subclass of ``optimizer``'s class over the same parameter
    groups (and state) whose ``step()`` first averages every gradient over the ranks.

    Arguments:
      named_parameters: ``model.named_parameters()``; names the all-reduces
        (``"grad.<name>"``), so names must be unique (InvalidArgumentError listing the
        duplicates) and cover every parameter of the optimizer. None: ``"param.<group>.<i>"``.
        The runtime keeps per-tensor state by name (error-feedback residuals, PowerSGD's Q),
        so two DistributedOptimizers alive in one process never share a name: when some of
        this optimizer's names are in use by another live one (a GAN's generator and
        discriminator both have a ``"weight"``), its all-reduces are named
        ``"grad.opt<i>/<name>"`` with the smallest i >= 1 whose names are free (the second
        optimizer of a GAN: ``"grad.opt1/weight"``). Every rank that constructs and keeps
        its optimizers in the same order picks the same names; an optimizer alone, or
        constructed after the previous one was dropped, keeps the plain names, and starts
        with fresh compression state for them as in a new job (what the runtime kept for
        the dropped optimizer's names is forgotten at construction; FailedPreconditionError
        if one of their all-reduces is still in flight), unless
        ``braid.load_compression_state()`` restored a state since the drop.
        ``add_param_group()`` takes the new parameters' names from here (a frozen layer
        named by ``model.named_parameters()`` can be added later), or from the group's
        ``"named_parameters"`` entry; without names, ``"param.<group>.<i>"``.
      compression: a spec string ("fp16", "fp4:ef=1", ...), a ``Compression`` member, a
        dict of parameter-name patterns to specs (compression per layer, e.g.
        ``{"*.bias": "none", "embedding.*": "scalecomp:ratio=100", "*": "powersgd:rank=4"}``:
        the first matching pattern in the dict's order wins; tensors too small or too flat
        for their method go uncompressed, docs/compression.md), a Horovod-style compressor
        object (compress/decompress, run around an uncompressed all-reduce), or None for the
        job's default (BRAID_COMPRESSION; ``none`` unless set).
      backward_passes_per_step: k backward passes accumulate (sum) into ``p.grad`` locally,
        as PyTorch accumulates them, then the sum is all-reduced (averaged over ranks, not
        over passes), as Horovod does. More than k passes before ``step()`` raise
        FailedPreconditionError.
      op: Average (default), Sum, Min, Max or Product. ``Adasum`` raises
        InvalidArgumentError (not implemented).
      gradient_predivide_factor: with Average, gradients are multiplied by
        1/gradient_predivide_factor before the sum and by gradient_predivide_factor/size after
        it (for float16 gradients that would overflow when summed). Other ops:
        InvalidArgumentError unless 1.
      sparse_as_dense: sparse gradients (``nn.Embedding(sparse=True)``) are densified and
        all-reduced; otherwise their indices and values are all-gathered and summed
        (Average divides the values by the world size; a rank that did not use the
        embedding in a step contributes no rows, whether its ``p.grad`` is None or emptied
        by ``zero_grad()``).
      groups: which gradients' all-reduces start together, as in Horovod: an integer k
        splits the parameters (in the optimizer's order) into k groups of consecutive ones
        (0: no groups); a list of lists of parameters makes each list a group (parameters in
        no list start on their own). A group's all-reduces start once backward has produced
        every gradient of the group, and travel fused in one bucket (when they fit under
        BRAID_FUSION_THRESHOLD), whatever the timing. None (default): one group of all
        parameters when the compression is a sparsifier that selects over whole buckets
        (scalecomp, topk or randomk with granularity=bucket, the default), so its top-k
        covers the whole model's gradient, as ScaleCom selects over the fused gradient,
        and the run repeats bit for bit; no groups otherwise (each all-reduce starts as soon
        as its gradient is ready, overlapping the rest of backward). Groups hold the
        parameters that train (``requires_grad``): a frozen parameter leaves its group
        until it is unfrozen (planned again between steps). num_groups: Horovod's
        older name for an integer ``groups`` (used when ``groups`` is None).
      process_set: the ProcessSet whose ranks train together (None: every rank): the
        gradients are averaged over its ranks only; only its ranks create the optimizer.
      gradient_as_bucket_view: as DDP's option of that name. False (default): each
        gradient is its own tensor, and the runtime copies the gradients of a fused bucket
        into its fusion buffer and the results back out. True: every parameter's ``.grad``
        (same shape and dtype as the parameter) becomes a view into one flat 1-D buffer per
        dtype (and device), allocated here, holding the gradients back to back in the
        order backward produces them: at first the reverse of the optimizer's parameter
        order (as DDP assumes), after the first ``step()``/``synchronize()`` the order
        their all-reduces started in during it (as DDP rebuilds its buckets; the gradients
        are copied over once). A bucket of gradients that lie back to back in its order is
        reduced where it lies, without those two copies (``braid.torch.fusion_stats()``
        shows the bytes packed and those reduced in place); the runtime's buckets are runs
        of consecutive gradients, so with a stable order every bucket does from the second
        step on. Results are bit-identical either way.
        Costs: the buffers hold every gradient from construction on (memory the
        gradients would take after the first backward anyway); ``zero_grad()`` zeroes them
        in place whatever ``set_to_none`` says (a gradient is never None, but that of a
        frozen parameter, which ``set_to_none=True`` sets to None); and the
        gradients are views, so code that replaces ``p.grad`` (``p.grad = t``, an
        optimizer or hook that does) breaks the sharing: ``step()`` restores ``p.grad`` to
        its view (holding the average) when the replacement came after backward, and the
        next all-reduce copies a replacement made before it into the view (a copy), so a
        reference kept to the replacement does not see the averaged gradient.

    Replacing ``p.grad`` between ``backward()`` and ``step()`` (``p.grad = p.grad / k``, a
    hook or clipping code that assigns a new tensor) is supported, as in Horovod: the
    all-reduce started from the tensor that was ``p.grad`` when backward's last pass
    produced it, and ``step()``/``synchronize()`` puts the result into the current
    ``p.grad`` (copied into the replacement; with gradient_as_bucket_view, ``p.grad``
    returns to its view, which holds it). So what the replacement held is overwritten by
    the average: values written into ``p.grad`` after backward are not all-reduced (scale
    the gradients after ``synchronize()`` instead). A replacement that cannot hold the
    result (sparse, where the gradient is dense) raises InvalidArgumentError naming the
    parameter; torch itself refuses another shape, dtype or device.

    ``add_param_group()`` (between steps) registers the new parameters: their gradients
    are all-reduced like the others' from the next backward on; options the group leaves
    out come from the wrapped optimizer's defaults (its ``lr``, ``momentum``, ...).

    Errors during training: ``zero_grad()`` between ``backward()`` and ``step()``
    (FailedPreconditionError), more backward passes than declared (FailedPreconditionError,
    raised from ``backward()``), and the collectives' own errors from ``step()`` /
    ``synchronize()``.

    Which parameters train may change between steps, as in one process: every step, the
    ranks first agree (one small all-reduce) on which gradients it reduces, those that some
    rank has. A parameter with no gradient on a rank in some step (a layer it did not use) is
    all-reduced as zeros by that rank (no rows, for a sparse gradient), so the ranks that
    used it do not wait; its ``p.grad`` then holds the average. A parameter no rank has a
    gradient for (frozen with ``requires_grad=False``, or unused everywhere) is not
    reduced: its ``p.grad`` stays as it is (None stays None, so momentum and weight decay do
    not move it), as in one process. A layer frozen when the optimizer was built, or later,
    and unfrozen between steps is averaged from then on (its hook is added at the next
    ``zero_grad()`` or step, and a gradient it has before that is all-reduced in
    ``step()``); a layer that every rank froze starts afresh when unfrozen, as a new layer
    would: its compression state (residuals, PowerSGD's Q, warm-up) is forgotten. Ranks that
    disagree (one froze a layer another has a gradient for, or one has a sparse gradient
    where another has a dense one) all raise InvalidArgumentError from ``step()``, naming
    the parameters and the ranks, and the parameters are not updated. A world of size 1 adds
    no hooks: ``step()`` is the wrapped optimizer's, with no communication (and so no
    compression).
    """
    _check_process_set("DistributedOptimizer", process_set)
    op = _check_op("DistributedOptimizer", "", op)
    _checks.check_int("DistributedOptimizer", "backward_passes_per_step",
                    backward_passes_per_step, 1, 1 << 31)
    if (isinstance(gradient_predivide_factor, bool) or
            not isinstance(gradient_predivide_factor, numbers.Real) or
            not math.isfinite(gradient_predivide_factor) or gradient_predivide_factor <= 0):
        raise InvalidArgumentError("DistributedOptimizer: gradient_predivide_factor must be a "
                                   f"finite number > 0, got {gradient_predivide_factor!r}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise InvalidArgumentError("DistributedOptimizer: gradient_predivide_factor needs "
                                   f"op=Average, got {op!r}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidArgumentError("DistributedOptimizer: expected a torch.optim.Optimizer, got "
                                   f"{type(optimizer).__name__}")
    cls = type(optimizer.__class__.__name__, (_DistributedMixin, optimizer.__class__),
               {"__doc__": _DistributedMixin.__doc__, "__module__": __name__})
    if groups is None and num_groups:
        groups = int(num_groups)
    return cls(optimizer.param_groups, optimizer.state, optimizer.defaults, named_parameters,
               compression,
               backward_passes_per_step, op, gradient_predivide_factor, sparse_as_dense,
               groups, bool(gradient_as_bucket_view),
               None if process_set is None or process_set.process_set_id == 0 else process_set)


def _empty_sparse(p, sparse_dim):
    """A sparse gradient of p with no rows: ``sparse_dim`` index columns, values of p's
    trailing dimensions."""
    indices = torch.zeros(sparse_dim, 0, dtype=torch.int64, device=p.device)
    values = torch.zeros((0,) + tuple(p.shape[sparse_dim:]), dtype=p.dtype, device=p.device)
    return torch.sparse_coo_tensor(indices, values, p.shape)


def _job_default_compression():
    """The canonical BRAID_COMPRESSION, "" when unset or invalid (init reports the latter)."""
    spec = os.environ.get("BRAID_COMPRESSION", "")
    if not _checks.is_utf8(spec):  # undecodable bytes in the variable: invalid, init says so
        return ""
    try:
        return _core_compression.canonical_compression(spec)
    except _BraidError:
        return ""


def _selects_over_buckets(spec):
    """True for a canonical spec of a sparsifier with granularity=bucket (its default), or
    a plan (canonical JSON) that gives one to some pattern."""
    spec = spec or ""
    if spec.startswith("{"):
        return any(isinstance(v, str) and _selects_over_buckets(v)
                   for v in json.loads(spec).values())
    method = spec.split(":", 1)[0].strip()
    return method in ("scalecomp", "topk", "randomk") and "granularity=tensor" not in spec
