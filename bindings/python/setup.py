"""Copies the workspace's target/release/libhccn.so into the package, so that the installed
package finds its library next to itself (HCCN_LIB overrides it at run time)."""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
BUILT = os.path.join(HERE, "..", "..", "target", "release", "libhccn.so")


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        if os.path.exists(BUILT):
            dest = os.path.join(self.build_lib, "hccn", "libhccn.so")
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(BUILT, dest)
        else:
            print(f"hccn: {BUILT} is not built; the package will need HCCN_LIB or a system libhccn.so")


setup(cmdclass={"build_py": BuildWithLibrary})
