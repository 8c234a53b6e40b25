"""Builds hccn's torch.distributed backend, the C++ extension ``hccn._torch_C``, against the
torch of the running interpreter (torch.utils.cpp_extension; no ninja needed).

    python bindings/python/build_torch_ext.py                # into <repo>/target/torch-ext/
    python bindings/python/build_torch_ext.py --out DIR      # into DIR/hccn/
    python bindings/python/build_torch_ext.py --install      # next to the installed hccn package
    python bindings/python/build_torch_ext.py --force ...    # rebuild even when up to date

``hccn.torch`` loads the extension from next to the ``hccn`` package it was imported from, else
from ``<repo>/target/torch-ext/`` when imported from the source tree. The extension calls
libhccn only through its C ABI and is not linked against it: it looks the functions up in the
library that ``hccn._raw`` loaded. It is tied to the torch version it was built against (C++ ABI):
a build states that version in ``DIR/hccn/_torch_C.json``, which ``hccn.torch`` checks at import,
records it with its sources' hash in ``DIR/hccn/_torch_C.stamp``, and is skipped when they have
not changed. Concurrent builds into one directory wait for each other.

The wheel (setup.py, when the building Python has torch) carries the module and both files.
"""

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "csrc")
INCLUDE = os.path.normpath(os.path.join(HERE, "..", "..", "include"))
DEFAULT_OUT = os.path.normpath(os.path.join(HERE, "..", "..", "target", "torch-ext"))
NAME = "hccn._torch_C"
STAMP = "_torch_C.stamp"
PAIRING = "_torch_C.json"


def sources():
    return sorted(os.path.join(CSRC, f) for f in os.listdir(CSRC) if f.endswith(".cpp"))


def extension():
    """The extension for setup(ext_modules=[...]), sources relative to bindings/python."""
    from torch.utils.cpp_extension import CppExtension

    rel = [os.path.relpath(s, HERE) for s in sources()]
    return CppExtension(
        NAME,
        rel,
        include_dirs=[INCLUDE],
        # -g0: debug info doubles the compile time of torch's headers; -fvisibility=hidden as
        # pybind11 asks for modules.
        extra_compile_args=["-O2", "-g0", "-fvisibility=hidden"],
    )


def build_ext_class():
    from torch.utils.cpp_extension import BuildExtension

    return BuildExtension.with_options(use_ninja=False)


def pairing():
    """What the module is tied to: torch's version (public and as installed), its C++ ABI, and
    Python's version; ``hccn.torch`` compares them with what it runs on."""
    import torch

    return {
        "torch": torch.__version__.split("+")[0],
        "torch_build": torch.__version__,
        "cxx11_abi": bool(torch.compiled_with_cxx11_abi()),
        "python": "%d.%d" % sys.version_info[:2],
    }


def fingerprint():
    import torch

    h = hashlib.sha256()
    h.update(torch.__version__.encode())
    h.update(sys.version.encode())
    for path in sources() + [os.path.join(INCLUDE, "hccn.h"), __file__] + [
        os.path.join(CSRC, f) for f in sorted(os.listdir(CSRC)) if f.endswith(".h")
    ]:
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode())
            h.update(f.read())
    return h.hexdigest()


def built_module(out):
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    return os.path.join(out, "hccn", "_torch_C" + suffix)


def build(out=DEFAULT_OUT, force=False, quiet=True):
    """Builds into ``out/hccn/`` unless it is up to date; returns (path, seconds, built)."""
    os.makedirs(os.path.join(out, "hccn"), exist_ok=True)
    stamp = os.path.join(out, "hccn", STAMP)
    want = fingerprint()
    with open(os.path.join(out, "hccn", ".build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process building the same directory finishes first
        module = built_module(out)
        complete = all(os.path.exists(f) for f in (module, stamp, os.path.join(out, "hccn", PAIRING)))
        if not force and complete:
            with open(stamp) as f:
                if f.read().strip() == want:
                    return module, 0.0, False
        t0 = time.monotonic()
        _compile(out, quiet)
        with open(os.path.join(out, "hccn", PAIRING), "w") as f:
            json.dump(pairing(), f, indent=1)
            f.write("\n")
        with open(stamp, "w") as f:
            f.write(want + "\n")
        return module, time.monotonic() - t0, True


def _compile(out, quiet):
    from setuptools import setup

    temp = tempfile.mkdtemp(prefix="hccn-torch-ext-")
    cwd = os.getcwd()
    try:
        os.chdir(HERE)  # the extension's sources are relative to bindings/python
        # --force: setuptools would skip the compiler when the .so is newer than the .cpp files,
        # although a header changed (the stamp already decided that a build is due).
        args = ["build_ext", "--force", "--build-lib", out, "--build-temp", temp]
        setup(
            name="hccn-torch-ext",
            ext_modules=[extension()],
            cmdclass={"build_ext": build_ext_class()},
            script_args=(["-q"] if quiet else []) + args,
        )
    finally:
        os.chdir(cwd)
        shutil.rmtree(temp, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", default=None, help=f"directory that gets hccn/_torch_C*.so (default {DEFAULT_OUT})")
    where.add_argument("--install", action="store_true", help="next to the installed hccn package")
    p.add_argument("--force", action="store_true", help="rebuild even when up to date")
    p.add_argument("--verbose", action="store_true", help="show the compiler's command lines")
    a = p.parse_args()
    out = a.out or DEFAULT_OUT
    if a.install:
        # The directory that holds the installed package (site-packages), not the source tree.
        sys.path = [x for x in sys.path if os.path.abspath(x or ".") != HERE]
        import hccn

        out = os.path.dirname(os.path.dirname(os.path.abspath(hccn.__file__)))
    path, seconds, built = build(out, force=a.force, quiet=not a.verbose)
    print(f"hccn._torch_C: {path} ({'built in %.0f s' % seconds if built else 'up to date'})")


if __name__ == "__main__":
    main()
