"""Builds the hccn wheel: the Python package plus what it needs to run without a Rust toolchain.

    pip wheel bindings/python            # after cargo build --release -p hccn-capi -p hccn-tools
    HCCN_BUILD_DIR=DIR pip wheel ...      # take the build from DIR instead of target/release

Into the package go, stripped of debug information (binutils' strip):
    hccn/lib/libhccn.so.1   the library (named by its soname, so an extension module linked
                            against it and hccn._raw share one loaded copy)
    hccn/bin/hccnrun, hccn-perf, hccn-trace, hccn-info
                            the tools, started by the console scripts of the same names
                            (hccn._cli), which `pip install` puts on the venv's PATH
    hccn/include/hccn.h, hccn.hpp
                            for extension modules built against the installed package
                            (hccn.get_include(), hccn.get_lib_dir())
    hccn/_torch_C*.so, _torch_C.json
                            torch.distributed's "hccn" backend, when the building Python has
                            torch (build_torch_ext.py: reused from target/torch-ext when up to
                            date), with the torch version it is tied to; the wheel's `torch`
                            extra then pins that version, and `import hccn.torch` checks it
The library and tools are required: a wheel without them would fail only at import or launch.
The torch backend is there only when torch is importable while building, i.e. without build
isolation (`pip wheel --no-build-isolation`, as scripts/release.sh --wheel does with the pinned
torch venv): the wheel is then for that CPython (cpXY), else for any Python 3 (py3-none).
"""

import os
import platform
import re
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 carries bdist_wheel itself
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # older setuptools with the wheel package
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
ABI = 1
TOOLS = ["hccnrun", "hccn-perf", "hccn-trace", "hccn-info"]
# The libraries a manylinux wheel may need from the system (PEP 600 / auditwheel's policy, the
# part our build can use).
MANYLINUX_LIBS = {
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "librt.so.1",
    "libpthread.so.0",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
}
# What a manylinux_2_N wheel may need of libstdc++ (auditwheel's policy): the newest GLIBCXX and
# CXXABI symbol versions, from the oldest glibc level that allows them.
LIBSTDCXX = [((2, 17), (3, 4, 19), (1, 3, 7)), ((2, 28), (3, 4, 24), (1, 3, 11)), ((2, 31), (3, 4, 28), (1, 3, 12)),
             ((2, 34), (3, 4, 29), (1, 3, 13)), ((2, 35), (3, 4, 30), (1, 3, 13)), ((2, 39), (3, 4, 33), (1, 3, 15))]
# The libraries of torch that the torch backend links: provided by the torch the wheel pins.
TORCH_LIBS = {"libc10.so", "libtorch_cpu.so", "libtorch.so", "libtorch_python.so"}
# The native files build_py put into the package, for the wheel's platform tag.
NATIVE_FILES = []


def torch_version():
    """The version (without its local part: 2.15.0, not 2.15.0+cu132) of the torch installed
    for this Python, for which the wheel's torch backend is built; None without torch. Read
    from the metadata, without importing torch: the metadata (the `torch` extra's pin) is made
    before the build."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch").split("+")[0]
    except PackageNotFoundError:
        return None


TORCH = torch_version()


def build_dir():
    return os.environ.get("HCCN_BUILD_DIR") or os.path.join(ROOT, "target", "release")


def strip(path, *flags):
    """Strips debug information (kept out of the wheel: tens of MB); without binutils the file
    stays as it is, with a warning."""
    if shutil.which("strip") is None:
        print(f"hccn: no strip on PATH; {os.path.basename(path)} keeps its debug information")
        return
    subprocess.run(["strip", *flags, path], check=True)


class BuildWithLibrary(build_py):
    """build_py that also puts the library, the tools and the headers into the package."""

    def run(self):
        super().run()
        src = build_dir()
        missing = [f for f in ["libhccn.so"] + TOOLS if not os.path.isfile(os.path.join(src, f))]
        if missing:
            raise SystemExit(
                f"hccn: {', '.join(missing)} not found in {src}: run "
                "`cargo build --release -p hccn-capi -p hccn-tools` first, or set HCCN_BUILD_DIR"
            )
        pkg = os.path.join(self.build_lib, "hccn")
        for sub in ["lib", "bin", "include"]:
            os.makedirs(os.path.join(pkg, sub), exist_ok=True)
        lib = os.path.join(pkg, "lib", f"libhccn.so.{ABI}")
        shutil.copyfile(os.path.join(src, "libhccn.so"), lib)
        os.chmod(lib, 0o755)
        strip(lib, "--strip-unneeded")
        for tool in TOOLS:
            dest = os.path.join(pkg, "bin", tool)
            shutil.copyfile(os.path.join(src, tool), dest)
            os.chmod(dest, 0o755)
            strip(dest)
        NATIVE_FILES[:] = [lib] + [os.path.join(pkg, "bin", t) for t in TOOLS]
        for header in ["hccn.h", "hccn.hpp"]:
            shutil.copyfile(os.path.join(ROOT, "include", header), os.path.join(pkg, "include", header))
        module = add_torch_backend(pkg)
        if module:
            NATIVE_FILES.append(module)


def add_torch_backend(pkg):
    """Puts torch's "hccn" backend (hccn/_torch_C*.so) into the package with what it was built
    for (hccn/_torch_C.json), when this Python has torch; returns the module's path or None."""
    if not TORCH:
        print("hccn: no torch in this Python: the wheel carries no torch backend")
        return None
    import torch

    if torch.__version__.split("+")[0] != TORCH:
        raise SystemExit(f"hccn: torch imports as {torch.__version__}, but its metadata says {TORCH}")
    sys.path.insert(0, HERE)
    import build_torch_ext

    path, seconds, built = build_torch_ext.build()  # target/torch-ext, skipped when up to date
    print(f"hccn: torch backend for torch {torch.__version__} ({'built in %.0f s' % seconds if built else 'up to date'})")
    module = os.path.join(pkg, os.path.basename(path))
    shutil.copyfile(path, module)
    os.chmod(module, 0o755)
    strip(module, "--strip-unneeded")
    # The stamp too: `build_torch_ext.py --install` then finds the installed module up to date.
    for name in (build_torch_ext.PAIRING, build_torch_ext.STAMP):
        shutil.copyfile(os.path.join(os.path.dirname(path), name), os.path.join(pkg, name))
    return module


class NativeDistribution(Distribution):
    """The package carries native code even without extension modules: install it as platform
    code (platlib, a platform-tagged wheel)."""

    def has_ext_modules(self):
        return True


def manylinux_platform(files):
    """``manylinux_2_N_<arch>`` (PEP 600) when every file needs no system library beyond
    MANYLINUX_LIBS (and libstdc++, with the symbol versions glibc 2.N's policy allows) and glibc
    2.N at most, so pip installs the wheel on any such Linux and refuses it, by its tag, where
    glibc is older; torch's libraries count as provided (the torch backend's wheel pins torch,
    which is itself a manylinux wheel). None when binutils cannot tell or a file needs more."""
    if not files or shutil.which("readelf") is None or shutil.which("objdump") is None:
        return None
    glibc, cxx = (2, 17), ((3, 4, 0), (1, 3, 0))
    allowed = MANYLINUX_LIBS | {"libstdc++.so.6"} | (TORCH_LIBS if TORCH else set())
    for f in files:
        dynamic = subprocess.run(["readelf", "-d", f], check=True, capture_output=True, text=True).stdout
        needed = set(re.findall(r"Shared library: \[([^\]]+)\]", dynamic))
        if not needed <= allowed:
            print(f"hccn: {os.path.basename(f)} needs {sorted(needed - allowed)}: not a manylinux wheel")
            return None
        symbols = subprocess.run(["objdump", "-T", f], check=True, capture_output=True, text=True).stdout
        for major, minor in re.findall(r"GLIBC_(\d+)\.(\d+)", symbols):
            glibc = max(glibc, (int(major), int(minor)))
        for name, i in (("GLIBCXX", 0), ("CXXABI", 1)):
            for v in re.findall(name + r"_(\d+(?:\.\d+)+)\b", symbols):
                cxx = tuple(max(c, tuple(int(x) for x in v.split("."))) if j == i else c for j, c in enumerate(cxx))
    level = next((lvl for lvl, glibcxx, cxxabi in LIBSTDCXX if cxx[0] <= glibcxx and cxx[1] <= cxxabi), None)
    if level is None:
        print("hccn: the native files need a libstdc++ newer than manylinux policies allow: not a manylinux wheel")
        return None
    glibc = max(glibc, level)
    return f"manylinux_{glibc[0]}_{glibc[1]}_{platform.machine()}"


class PlatformWheel(bdist_wheel):
    """Tagged for the platform: manylinux_2_N_<arch> from what the native files need (else
    linux_<arch>); without the torch backend (a CPython extension) the package loads the library
    through ctypes and suits any Python 3 (py3-none)."""

    def get_tag(self):
        python, abi, plat = super().get_tag()
        if not TORCH:
            python, abi = "py3", "none"
        if plat.startswith("linux_"):
            plat = manylinux_platform(NATIVE_FILES) or plat
        return python, abi, plat


def extras():
    """`numpy`, and `torch`: the torch the wheel's backend is built for (any torch without one)."""
    return {"numpy": ["numpy"], "torch": [f"torch=={TORCH}" if TORCH else "torch"]}


setup(
    distclass=NativeDistribution,
    extras_require=extras(),
    cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PlatformWheel},
)
