"""The Python package's shape: what it exports, and how its modules depend on each other.

- The names ``braid``, ``braid.numpy``, ``braid.torch`` and ``braid.torch.mpi_ops`` export
  (``__all__``) are the documented ones (README: Python API, PyTorch API), and the error
  classes and reduce ops are the same objects in every frontend, listed once, in
  braid/_core/errors.py.
- Every module of the package is one CMake copies into the build tree and installs.
- Between the package's modules, public names only: no module imports another module's
  ``_private`` names or reads them off an imported module, and only the core (braid/_core)
  imports the native module ``braid._braid``. Checked on the sources with ``ast``.
"""

import ast
import json
import re
import subprocess
from pathlib import Path

import pytest

import braid_launch

PACKAGE = braid_launch.REPO / "bindings" / "python" / "braid"
CORE = "braid._core"
NATIVE = "braid._braid"

# The errors and ops every frontend exports (braid/_core/errors.py's __all__).
ERRORS_AND_OPS = {
    "AlreadyExistsError", "BraidError", "CancelledError", "DeadlineExceededError",
    "FailedPreconditionError", "InternalError", "InvalidArgumentError", "UnavailableError",
    "ReduceOp", "Sum", "Average", "Min", "Max", "Product",
}
# README: Python API (`import braid`); braid.numpy exports the same.
NUMPY_API = ERRORS_AND_OPS | {
    "Handle", "SUPPORTED_DTYPES", "init", "shutdown", "is_initialized", "size", "rank",
    "local_rank", "local_size", "is_homogeneous", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "allgather", "allgather_async", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "reducescatter", "reducescatter_async", "alltoall",
    "alltoall_async", "barrier", "join", "poll", "synchronize", "broadcast_object",
    "allgather_object", "compression_stats", "fusion_stats", "compression_state",
    "load_compression_state", "start_timeline", "stop_timeline", "transport_description",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
}
# Horovod's horovod.torch.mpi_ops: the collectives, handles, errors and ops.
TORCH_MPI_OPS_API = ERRORS_AND_OPS | {
    "Adasum", "Handle", "SUPPORTED_DTYPES", "global_process_set", "staging_copies",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "allgather",
    "allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "barrier", "join",
    "poll", "synchronize",
}
# README: PyTorch API (`import braid.torch as hvd`).
TORCH_API = TORCH_MPI_OPS_API | {
    "init", "shutdown", "is_initialized", "size", "rank", "local_rank", "local_size",
    "cross_rank", "cross_size", "compression_stats", "fusion_stats", "compression_state",
    "load_compression_state", "start_timeline",
    "stop_timeline", "transport_description", "Compression", "Compressor",
    "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
    "ProcessSet", "add_process_set", "remove_process_set",
    "broadcast_object", "allgather_object", "nccl_built", "mpi_built", "gloo_built",
    "cuda_built", "rocm_built", "is_homogeneous", "mpi_enabled", "gloo_enabled",
    "mpi_threads_supported", "SyncBatchNorm", "ddp_comm_hook",
}

EXPORTS = r"""
import inspect, json, types
import braid, braid.numpy, braid.torch, braid.torch.mpi_ops
out = {}
for mod in (braid, braid.numpy, braid.torch, braid.torch.mpi_ops):
    public = [k for k, v in vars(mod).items()
              if not k.startswith("_") and not isinstance(v, types.ModuleType)]
    out[mod.__name__] = {"all": list(mod.__all__), "public": public,
                         "missing": [k for k in mod.__all__ if not hasattr(mod, k)]}
shared = {}
for n in braid._core.errors.__all__:
    shared[n] = all(getattr(m, n) is getattr(braid, n)
                    for m in (braid.numpy, braid.torch, braid.torch.mpi_ops))
out["shared_identical"] = shared
print(json.dumps(out))
"""


def _exports():
    build = braid_launch.build_dir()
    p = subprocess.run([braid_launch.PYTHON, "-c", EXPORTS], env=braid_launch.rank_env(build, {}),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.splitlines()[-1])


def test_exported_names_are_the_documented_ones():
    """__all__ of braid, braid.numpy, braid.torch and braid.torch.mpi_ops is the documented
    set, every name in it exists, and no other public name (a module aside) is there."""
    pytest.importorskip("torch")
    got = _exports()
    for module, expected in (("braid", NUMPY_API), ("braid.numpy", NUMPY_API),
                             ("braid.torch", TORCH_API),
                             ("braid.torch.mpi_ops", TORCH_MPI_OPS_API)):
        entry = got[module]
        names = entry["all"]
        assert len(names) == len(set(names)), f"{module}.__all__ repeats a name: {names}"
        assert set(names) == expected, (
            f"{module}.__all__: missing {sorted(expected - set(names))}, "
            f"unexpected {sorted(set(names) - expected)}")
        assert not entry["missing"], f"{module}.__all__ names what it lacks: {entry['missing']}"
        extra = sorted(set(entry["public"]) - expected)
        assert not extra, f"{module} has public names outside __all__: {extra}"
    assert all(got["shared_identical"].values()), got["shared_identical"]


# --- public names only between modules ----------------------------------------------------

def _is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path, root):
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


class _Package:
    """The package's modules: dotted name -> (path, is a package)."""

    def __init__(self, root):
        self.root = root
        self.modules = {}
        for path in sorted(root.rglob("*.py")):
            self.modules[_module_name(path, root)] = (path, path.name == "__init__.py")
        self.modules[NATIVE] = (None, False)  # the extension: a module without a .py

    def is_module(self, dotted):
        return dotted in self.modules

    def resolve(self, importer, level, module):
        """The dotted name an ImportFrom in ``importer`` refers to."""
        if level == 0:
            return module or ""
        base = importer.split(".")
        if not self.modules[importer][1]:  # a plain module: relative to its package
            base = base[:-1]
        base = base[:len(base) - (level - 1)]
        return ".".join(base + ([module] if module else []))


def violations(package, importer, source):
    """The ways the module ``importer`` (dotted name), whose text is ``source``, breaks the
    rules: a list of "line: what" strings."""
    in_core = importer == CORE or importer.startswith(CORE + ".")
    tree = ast.parse(source)
    bound = {}  # a local name -> the package module it is bound to
    out = []

    def native(line, how):
        if not in_core:
            out.append(f"{line}: {how} the native module {NATIVE} outside {CORE}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == NATIVE or a.name.startswith(NATIVE + "."):
                    native(node.lineno, "imports")
                if package.is_module(a.name):
                    bound[a.asname or a.name.split(".")[0]] = (
                        a.name if a.asname else a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            target = package.resolve(importer, node.level, node.module)
            if not target.split(".")[0] == "braid":
                continue
            if target == NATIVE:
                native(node.lineno, "imports from")
            for a in node.names:
                if a.name == "*":
                    continue
                sub = f"{target}.{a.name}"
                if package.is_module(sub):
                    if sub == NATIVE:
                        native(node.lineno, "imports")
                    bound[a.asname or a.name] = sub
                elif _is_private(a.name):
                    out.append(f"{node.lineno}: imports {a.name}, a private name of {target}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in bound and _is_private(node.attr)):
            module = bound[node.value.id]
            if f"{module}.{node.attr}" == NATIVE:
                native(node.lineno, "reads")
            elif not package.is_module(f"{module}.{node.attr}"):
                out.append(f"{node.lineno}: reads {node.value.id}.{node.attr}, a private name "
                           f"of {module}")
    return out


def test_modules_use_only_public_names_of_each_other():
    package = _Package(PACKAGE)
    found = []
    for name, (path, _) in package.modules.items():
        if path is not None:
            found += [f"{path.relative_to(braid_launch.REPO)}:{v}"
                      for v in violations(package, name, path.read_text())]
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_the_check_catches_private_names_and_the_native_module():
    """The check itself, on made-up modules: each rule fires, public names pass."""
    package = _Package(PACKAGE)
    bad = ("from .._core.runtime import _topo, next_name\n"
           "from .._core import runtime as rt\n"
           "from .. import _braid\n"
           "from . import _handles\n"
           "rt.next_name('x'); rt._forked_child(); _handles.wire\n")
    got = violations(package, "braid.torch.mpi_ops", bad)
    assert any("_topo" in v for v in got), got
    assert any("rt._forked_child" in v for v in got), got
    assert any("native module" in v for v in got), got
    assert not any("next_name" in v or "_handles" in v for v in got), got
    assert violations(package, "braid._core.stats", "from .. import _braid\n") == []


def test_the_errors_and_ops_are_listed_once():
    """Only braid/_core/errors.py spells out the list of error classes and ops (a list or
    tuple of their names); the frontends take it from there."""
    holders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and any(
                    isinstance(e, ast.Constant) and e.value == "UnavailableError"
                    for e in node.elts):
                holders.append(str(path.relative_to(PACKAGE)))
    assert holders == [str(Path("_core") / "errors.py")], holders


def test_cmake_copies_and_installs_every_module():
    """bindings/python/CMakeLists.txt lists every .py file of the package (the build tree's
    package and `cmake --install` take their files from its lists), and nothing else."""
    listed = set(re.findall(r"^\s*(braid/\S+\.py)\)?\s*$",
                            (PACKAGE.parent / "CMakeLists.txt").read_text(), re.M))
    present = {str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")}
    assert listed == present, (f"not in CMakeLists.txt: {sorted(present - listed)}; "
                               f"listed but absent: {sorted(listed - present)}")
