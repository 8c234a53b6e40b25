"""Console scripts of the wheel: each replaces the Python process with the native tool of the
same name carried in ``hccn/bin`` (exit codes and signals then pass straight through)."""

import os
import sys

BIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def _exec(name, *first):
    path = os.path.join(BIN_DIR, name)
    if not os.access(path, os.X_OK):
        sys.exit(
            f"{name}: {path} is missing: this hccn package was installed without its tools "
            "(reinstall it from the wheel, or build with cargo build --release -p hccn-tools)"
        )
    os.execv(path, [name, *first] + sys.argv[1:])


def hccnrun():
    # A *.py program runs with this Python (the one hccn is installed in), as torchrun does.
    _exec("hccnrun", "--python", sys.executable)


def hccn_perf():
    _exec("hccn-perf")


def hccn_trace():
    _exec("hccn-trace")


def hccn_info():
    _exec("hccn-info")
