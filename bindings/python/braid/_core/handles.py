"""Handles of asynchronous collectives, shared by braid's frontends.

A frontend wraps the native handle the runtime returns (``braid._braid``'s) in a subclass of
HandleBase, registers it with ``keep_alive`` so that the buffers the runtime reads and writes
outlive the caller's references, and answers ``poll`` and ``synchronize`` with
``poll_handle`` and ``wait_handle``. A handle leaves the registry when it completes.
"""

import threading

from .checks import check_timeout
from .errors import BraidError, DeadlineExceededError, InvalidArgumentError

_lock = threading.Lock()
_inflight = {}       # id(handle) -> handle: keeps arrays/tensors alive until the runtime is done
_sweep_at = 64       # sweep _inflight for completed handles once it holds this many


def keep_alive(handle):
    """Registers an in-flight handle (numpy or torch) so that its buffers outlive the caller's
    references until the runtime is done with them. A handle leaves on completion (its
    ``_finish``); handles the caller dropped without synchronizing are swept out once the
    registry doubles, so a step that enqueues many tensors costs O(1) per enqueue."""
    global _sweep_at
    with _lock:
        _inflight[id(handle)] = handle
        if len(_inflight) >= _sweep_at:
            for k in [k for k, v in _inflight.items() if v._native.poll()]:
                del _inflight[k]
            _sweep_at = max(64, 2 * len(_inflight))


def forget(handle):
    """Takes ``handle`` out of the registry (it completed)."""
    with _lock:
        _inflight.pop(id(handle), None)


def forget_all():
    """Empties the registry: the runtime shut down, and every handle has completed."""
    with _lock:
        _inflight.clear()


class HandleBase:
    """What the NumPy and torch handles share: the native handle, the objects the runtime
    reads and writes (kept until completion), and the result or error once it completed.
    Subclasses set ``_label`` and compute their result in ``_result_of()`` (called once, on
    success) and drop their buffers in ``_release()``."""

    __slots__ = ("_native", "_collective", "_keep", "_result", "_error", "_done",
                 "__weakref__")
    _label = "braid.Handle"

    def __init__(self, native, collective, keep):
        self._native = native
        self._collective = collective
        self._keep = keep          # objects the runtime reads or writes
        self._result = None
        self._error = None
        self._done = False

    @property
    def name(self):
        """The collective's name (the one negotiated across ranks)."""
        return self._native.name

    def __repr__(self):
        state = "done" if self._poll() else "pending"
        return f"<{self._label} {self._collective} '{self.name}' {state}>"

    def _poll(self):
        return self._done or self._native.poll()

    def _wait(self, timeout):
        """The result (or the collective's error) once completed; DeadlineExceededError when
        still running after ``timeout`` seconds (None: no limit; the handle stays valid)."""
        if not self._done:
            if not self._native.wait(timeout, 0.1):
                raise DeadlineExceededError(
                    f"{self._collective} '{self.name}' is still running after {timeout} s")
            self._finish()
        if self._error is not None:
            raise self._error
        return self._result

    def _finish(self):
        """Called once the native handle completed: result or stored error."""
        if self._done:
            return
        try:
            self._native.check()
            self._result = self._result_of()
        except BraidError as e:
            self._error = e
        finally:
            self._done = True
            self._keep = None
            self._release()
            forget(self)

    def _result_of(self):
        raise NotImplementedError

    def _release(self):
        pass


class MultiHandle:
    """Several collectives that complete together (grouped all-reduce, all-to-all with its
    received splits); ``combine`` turns their results into the caller's. Subclasses set
    ``_label``, the repr's name of the handle type."""

    __slots__ = ("_handles", "_combine", "_collective", "__weakref__")
    _label = "braid.Handle"

    def __init__(self, handles, combine, collective):
        self._handles = handles
        self._combine = combine
        self._collective = collective

    @property
    def name(self):
        """The name of the first collective (the one the caller named)."""
        return self._handles[0].name if self._handles else ""

    def __repr__(self):
        state = "done" if self._poll() else "pending"
        return f"<{self._label} {self._collective} '{self.name}' ({len(self._handles)}) {state}>"

    def _poll(self):
        return all(h._poll() for h in self._handles)

    def _wait(self, timeout):
        # Every part is waited for (and finished) before any error is raised, so no buffer is
        # released while the runtime may still write it.
        first_error = None
        for h in self._handles:
            try:
                h._wait(timeout)
            except BraidError as e:
                if isinstance(e, DeadlineExceededError) and not h._poll():
                    raise
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        return self._combine([h._result for h in self._handles])


def _check_handle(fn, handle, kinds):
    """InvalidArgumentError naming ``fn`` unless ``handle`` is one of ``kinds`` (a class or a
    tuple of classes: the calling frontend's handles)."""
    if not isinstance(handle, kinds):
        raise InvalidArgumentError(f"{fn}: expected a handle returned by an *_async call, "
                                   f"got {type(handle).__name__} {handle!r}")


def poll_handle(fn, handle, kinds):
    """True once the collective behind ``handle`` has completed (successfully or not); never
    blocks and never raises the collective's error. InvalidArgumentError naming ``fn`` if
    ``handle`` is not one of ``kinds``."""
    _check_handle(fn, handle, kinds)
    return handle._poll()


def wait_handle(fn, handle, timeout, kinds):
    """The result of the collective behind ``handle`` once it completed, or its error.
    ``timeout``: seconds (None = forever); DeadlineExceededError when it is still running
    then (the handle stays valid). InvalidArgumentError naming ``fn`` if ``handle`` is not one
    of ``kinds``, or for a ``timeout`` that is not None or a number >= 0."""
    _check_handle(fn, handle, kinds)
    return handle._wait(check_timeout(timeout))
