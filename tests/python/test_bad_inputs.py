"""Bad inputs from Python (workers/bad_inputs.py): configuration variables, names, ranks,
splits, ops, timeouts, compression specs, scale factors and oversized shapes, through the
NumPy and PyTorch APIs. Each raises braid.InvalidArgumentError naming the argument (never a
TypeError of the binding, never a truncated float), and the job goes on working after all of
them. The C API's cases are in tests/c_api/c_api_test.cc, the wire's in
tests/mp/coordinator_wire_test.cc.
"""

import re
import subprocess
import tempfile
from pathlib import Path

import pytest

import braid_launch


def test_bad_inputs_each_give_their_clear_error():
    build = braid_launch.build_dir()
    script = Path(__file__).resolve().parent / "workers" / "bad_inputs.py"
    # A job of one rank without a launcher: the process hosts its own coordinator.
    res = subprocess.run([braid_launch.PYTHON, str(script)], cwd=script.parent,
                         env=braid_launch.rank_env(build), capture_output=True, text=True,
                         timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "all checks passed" in out, out
    cases = int(re.search(r"bad inputs: (\d+) cases", out).group(1))
    assert cases >= 30, out
    assert len(re.findall(r"^case \d+: .* -> InvalidArgumentError: ", out, re.M)) == cases, out


# Usage errors of every tool: exit code 2 and a message naming the flag (never CLI11's own
# codes, 100 and up).
TOOL_CASES = [
    (["tools/braidrun/braidrun", "-np", "1.5", "true"], "-np must be an integer, got '1.5'"),
    (["tools/braidrun/braidrun", "-np", "2", "--negotiation-timeout", "inf", "true"],
     "--negotiation-timeout must be a positive number of seconds, got 'inf'"),
    (["tools/braidrun/braidrun", "-np", "2", "--heartbeat-timeout", "0.05", "true"],
     "--heartbeat-timeout must be at least 400ms"),
    (["tools/coordinator/braid-coordinator", "--port", "99999"],
     "--port must be in [0, 65535], got 99999"),
    (["tools/coordinator/braid-coordinator", "--no-such-flag"], "--no-such-flag"),
    (["tools/coordinator/braid-coordinator", "--register-timeout", "0"],
     "--register-timeout must be a positive number of seconds, got '0'"),
    (["tools/braidrun/braidrun", "-np", "2", "--register-timeout", "1e3", "true"],
     "--register-timeout must be a positive number of seconds, got '1e3'"),
    (["tools/braidctl/braidctl", "status", "--coordinator", "nohost"],
     "--coordinator must be HOST:PORT"),
    (["tools/braidctl/braidctl", "status", "--watch", "-1"],
     "--watch must be a non-negative number of seconds, got '-1'"),
    (["tools/bench/braid-bench", "allreduce", "-n", "1.5"], "--iters"),
]


def _usage_error(argv, env=None):
    """stderr of build-tree tool argv[0] run with argv[1:] (and `env` added to its
    environment), after asserting it exited 2."""
    build = braid_launch.build_dir()
    res = subprocess.run([str(build / argv[0])] + argv[1:],
                         env=braid_launch.rank_env(build, env), capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2, (argv, res.returncode, res.stderr)
    return res.stderr


def test_tool_usage_errors_exit_2_naming_the_flag():
    for argv, want in TOOL_CASES:
        err = _usage_error(argv)
        assert want in err, (argv, err)


# CLI11's own usage errors (an unknown flag) start with the tool's name, as braid's do.
CLI11_CASES = [
    (["tools/braidrun/braidrun", "-np", "1", "--bogus", "true"],
     "braidrun: The following argument was not expected: --bogus\n"),
    (["tools/coordinator/braid-coordinator", "--no-such-flag"],
     "braid-coordinator: The following argument was not expected: --no-such-flag\n"),
    (["tools/braidctl/braidctl", "status", "--bogus"],
     "braidctl: The following argument was not expected: --bogus\n"),
]


def test_every_tool_names_itself_in_cli11_usage_errors():
    for argv, want in CLI11_CASES:
        err = _usage_error(argv)
        assert err.startswith(want), (argv, err)


@pytest.mark.parametrize("launcher", [{}, {"BRAID_RANK": "0", "BRAID_SIZE": "1"}],
                         ids=["no launcher", "braid's own variables"])
def test_a_misspelt_or_horovod_variable_is_a_warning_at_init_without_braidrun(launcher):
    """A process without braidrun warns once at init about a BRAID_ variable braid does not
    read (naming the closest one) and a Horovod variable with a braid equivalent, and runs:
    also when a launcher of its own set BRAID_RANK and BRAID_SIZE (only braidrun, which
    warned for the whole job already, silences the ranks)."""
    build = braid_launch.build_dir()
    env = braid_launch.rank_env(build, {"BRAID_COMPRESION": "fp16",
                                        "HOROVOD_CYCLE_TIME": "5", **launcher})
    res = subprocess.run([braid_launch.PYTHON, "-c",
                          "import braid; braid.init(); braid.init(); print('ok', braid.size())"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "ok 1\n", res.stdout
    warning = ("braid: BRAID_COMPRESION is not a braid variable and is ignored: did you mean "
               "BRAID_COMPRESSION?\n")
    assert res.stderr.count(warning) == 1, res.stderr
    assert res.stderr.count("braid: HOROVOD_CYCLE_TIME is Horovod's and braid ignores it: set "
                            "BRAID_CYCLE_TIME_MS (milliseconds, as Horovod's) instead\n") == 1, \
        res.stderr


WEAK = ("the secret is too weak: a secret must hold at least 128 bits (32 hex digits, or 22 "
        "characters of mixed-case letters and digits) with at least 8 different characters; "
        "this one has 1 characters, 1 different, about 4 bits.")


def test_every_entry_of_a_job_secret_refuses_a_weak_one():
    """BRAID_JOB_SECRET=x and a one-byte secret file (a brute force guessed such a secret in 34
    tries) are refused wherever a secret enters, naming the minimum: braidrun,
    braid-coordinator and braidctl exit 2 (from the variable, BRAID_JOB_SECRET_FILE and
    --secret-file alike), and a rank's init raises InvalidArgumentError."""
    build = braid_launch.build_dir()
    with tempfile.TemporaryDirectory(prefix="braid-weak-") as tmp:
        weak = Path(tmp) / "weak.secret"
        weak.write_text("x\n")
        weak.chmod(0o600)
        tools = [["tools/braidrun/braidrun", "-np", "1", "true"],
                 ["tools/coordinator/braid-coordinator", "--port=0"],
                 ["tools/braidctl/braidctl", "status", "--coordinator=127.0.0.1:1"]]
        for argv in tools:
            with_file = argv[:-1] + ["--secret-file", str(weak)] + argv[-1:]
            for args, env, want in [
                    (argv, {"BRAID_JOB_SECRET": "x"}, f"BRAID_JOB_SECRET: {WEAK}"),
                    (argv, {"BRAID_JOB_SECRET_FILE": str(weak)},
                     f"BRAID_JOB_SECRET_FILE '{weak}': {WEAK}"),
                    (with_file, {}, f"--secret-file '{weak}': {WEAK}")]:
                err = _usage_error(args, env)
                assert want in err, (args, env, err)
        res = subprocess.run(
            [braid_launch.PYTHON, "-c",
             "import braid\ntry:\n    braid.init()\nexcept braid.InvalidArgumentError as e:\n"
             "    print('InvalidArgumentError:', e)\n"],
            env=braid_launch.rank_env(build, {"BRAID_JOB_SECRET": "x"}), capture_output=True,
            text=True, timeout=60)
        assert f"InvalidArgumentError: BRAID_JOB_SECRET: {WEAK}" in res.stdout, res
