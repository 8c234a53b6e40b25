"""The version guard, on a library that build.sh --built-for recorded for another MindSpore.

Run (one process, no hccnrun): PYTHONPATH=<build.sh --built-for V --out> python version_guard.py V
Both ways in must refuse with a sentence naming both versions:
- `import hccn_ms` raises ImportError;
- loading the library the way MindSpore finds it (the soname registered, the Open MPI variables
  set, the package's own check bypassed) makes MindSpore's init() raise.
Prints "[mindspore-guard] ok", or FAIL lines and exits 1.
"""

import ctypes
import importlib.util
import os
import sys

pretend = sys.argv[1]
failed = False


def expect(what, message):
    global failed
    for needle in (f"built for MindSpore {pretend}", "runs MindSpore 2.10.0", "rebuild"):
        if needle not in message:
            print(f"FAIL {what}: {needle!r} not in {message!r}", flush=True)
            failed = True


try:
    import hccn_ms  # noqa: F401

    print("FAIL import hccn_ms succeeded", flush=True)
    failed = True
except ImportError as e:
    expect("import hccn_ms", str(e))

package = os.path.dirname(importlib.util.find_spec("hccn_ms").origin)
ctypes.CDLL(os.path.join(package, "libhccn_ms.so"))
os.environ.update(OMPI_COMMAND="version_guard", PMIX_RANK="0")
import mindspore as ms  # noqa: E402
from mindspore.communication import init  # noqa: E402

ms.set_context(device_target="CPU")
try:
    init()
    print("FAIL mindspore.communication.init() succeeded", flush=True)
    failed = True
except RuntimeError as e:
    expect("mindspore.communication.init()", str(e))

print("FAIL" if failed else "[mindspore-guard] ok", flush=True)
sys.exit(1 if failed else 0)
