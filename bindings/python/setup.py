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
The library and tools are required: a wheel without them would fail only at import or launch.
"""

import os
import platform
import re
import shutil
import subprocess

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
# The native files build_py put into the package, for the wheel's platform tag.
NATIVE_FILES = []


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


class NativeDistribution(Distribution):
    """The package carries native code even without extension modules: install it as platform
    code (platlib, a platform-tagged wheel)."""

    def has_ext_modules(self):
        return True


def manylinux_platform(files):
    """``manylinux_2_N_<arch>`` (PEP 600) when every file needs no system library beyond
    MANYLINUX_LIBS and glibc 2.N at most, so pip installs the wheel on any such Linux and refuses
    it, by its tag, where glibc is older; None when binutils cannot tell or a file needs more."""
    if not files or shutil.which("readelf") is None or shutil.which("objdump") is None:
        return None
    glibc = (2, 17)
    for f in files:
        dynamic = subprocess.run(["readelf", "-d", f], check=True, capture_output=True, text=True).stdout
        needed = set(re.findall(r"Shared library: \[([^\]]+)\]", dynamic))
        if not needed <= MANYLINUX_LIBS:
            print(f"hccn: {os.path.basename(f)} needs {sorted(needed - MANYLINUX_LIBS)}: not a manylinux wheel")
            return None
        symbols = subprocess.run(["objdump", "-T", f], check=True, capture_output=True, text=True).stdout
        for major, minor in re.findall(r"GLIBC_(\d+)\.(\d+)", symbols):
            glibc = max(glibc, (int(major), int(minor)))
    return f"manylinux_{glibc[0]}_{glibc[1]}_{platform.machine()}"


class PlatformWheel(bdist_wheel):
    """Tagged for the platform: manylinux_2_N_<arch> from what the native files need (else
    linux_<arch>); without extension modules the package loads the library through ctypes and
    suits any Python 3 (py3-none)."""

    def get_tag(self):
        python, abi, plat = super().get_tag()
        if not self.distribution.ext_modules:
            python, abi = "py3", "none"
        if plat.startswith("linux_"):
            plat = manylinux_platform(NATIVE_FILES) or plat
        return python, abi, plat


def extension_modules():
    """Compiled extension modules the package carries; none yet. One added here (the torch
    backend's C++ extension, for instance) links the library through the C ABI with an rpath
    of $ORIGIN/lib (or $ORIGIN/../lib from a subpackage), so it finds hccn/lib/libhccn.so.1;
    the wheel's tag then names the Python ABI by itself."""
    return []


setup(
    distclass=NativeDistribution,
    ext_modules=extension_modules(),
    cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PlatformWheel},
)
