"""Builds the measurement-only null backend (null_backend.cpp) into target/torch-floor; prints the
directory to put on sys.path. Used by benches/small_allreduce_torch.py --backend null."""

import fcntl
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "..", "target", "torch-floor"))


def build():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, ".build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other rank builds it first
        return _build()


def _build():
    import sysconfig

    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    module = os.path.join(OUT, "torch_null_backend" + sysconfig.get_config_var("EXT_SUFFIX"))
    src = os.path.join(HERE, "null_backend.cpp")
    if os.path.exists(module) and os.path.getmtime(module) > os.path.getmtime(src):
        return OUT
    temp = tempfile.mkdtemp(prefix="torch-floor-")
    try:
        setup(
            name="torch-null-backend",
            ext_modules=[CppExtension("torch_null_backend", [src], extra_compile_args=["-O2", "-g0"])],
            cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
            script_args=["-q", "build_ext", "--build-lib", OUT, "--build-temp", temp],
        )
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return OUT


if __name__ == "__main__":
    print(build())
    sys.exit(0)
