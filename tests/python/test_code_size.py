"""The size limits of braid's core C++ (runtime/, coordinator/, transport/, control/, device/): no
product file over 500 lines and no function over 60 lines, so each part stays readable in
one sitting. Benchmarks live under tools/ and are not held to it.

A function is found the way this code base writes them: its first line starts at column 0
(a return type, then a name and a parenthesis) and its body ends at the next line that is
exactly "}". Brace-matching by hand instead of a C++ parser: the layout is the project's own
(one formatter, no macros that open functions), and Debian has no clang bindings for
Python that would parse the real thing."""
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DIRS = ("runtime", "coordinator", "transport", "control", "device")
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60
NOT_A_FUNCTION = ("namespace", "class ", "struct ", "enum ", "using ", "typedef ", "#", "//",
                  "}", "extern ", "template")


def functions(text):
    """(first line, length in lines, signature) of every function defined at column 0."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line and not line[0].isspace() and not line.startswith(NOT_A_FUNCTION) and "(" in line:
            j = i
            while j < len(lines) and j < i + 8 and not lines[j].rstrip().endswith("{"):
                if lines[j].rstrip().endswith(";"):
                    break
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith("{"):
                k = j + 1
                while k < len(lines) and lines[k] != "}":
                    k += 1
                yield i + 1, k - i + 1, line.strip()
                i = k + 1
                continue
        i += 1


def sources():
    for d in DIRS:
        for p in sorted((ROOT / d).glob("*.cc")) + sorted((ROOT / d).glob("*.h")):
            yield p


def test_no_product_file_is_over_the_limit():
    long = [f"{p.relative_to(ROOT)}: {p.read_text().count(chr(10))} lines"
            for p in sources() if p.read_text().count("\n") > MAX_FILE_LINES]
    assert not long, f"over {MAX_FILE_LINES} lines: {long}"


def test_no_function_is_over_the_limit():
    long = [f"{p.relative_to(ROOT)}:{start}: {n} lines: {sig[:70]}"
            for p in sources() for start, n, sig in functions(p.read_text())
            if n > MAX_FUNCTION_LINES]
    assert not long, f"over {MAX_FUNCTION_LINES} lines: {long}"


@pytest.mark.parametrize("body,expected", [
    # A two-line signature and a 3-line body: 6 lines from the signature to the brace.
    ("int Add(int a,\n        int b) {\n  int c = a;\n  c += b;\n  return c;\n}\n", [(1, 6)]),
    # Declarations, a table and a class are not functions.
    ("int Add(int a, int b);\nconst int kT[] = {\n  1,\n};\nclass A {\n  void f() {}\n};\n", []),
    # Two functions, the second found after the first ends.
    ("void f() {\n}\nvoid g() {\n  h();\n}\n", [(1, 2), (3, 3)]),
])
def test_the_counter_finds_functions_as_written_here(body, expected):
    assert [(s, n) for s, n, _ in functions(body)] == expected
