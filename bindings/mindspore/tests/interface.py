"""Runs tests/interface.cc (built by build.sh --interface-test) in a Python process, which
MindSpore's libraries expect around them: hccn_ms_interface_test(OUT/hccn_ms/libhccn_ms.so).

Run: hccnrun -n N -- python interface.py OUT     (exits with the test's status)
"""

import ctypes
import os
import sys

out = sys.argv[1]
test = ctypes.CDLL(os.path.join(out, "hccn_ms_interface_test.so"))
test.hccn_ms_interface_test.restype = ctypes.c_int
sys.exit(test.hccn_ms_interface_test(os.path.join(out, "hccn_ms", "libhccn_ms.so").encode()))
