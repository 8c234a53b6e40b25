"""MindSpore over hccn under msrun (CPU): with bindings/mindspore built (build.sh) on PYTHONPATH,

    msrun --worker_num 2 --local_worker_num 2 --master_port 8118 --join True ms_allreduce.py

hccn_ms forms hccn's world from msrun's variables, makes MindSpore's init() use hccn, and ends
msrun's scheduler process, which hccn does not need (docs/launchers.md). Each worker's line is in
msrun's log directory (worker_N.log).
"""

import hccn_ms  # first: under msrun it forms hccn's world from msrun's variables
import numpy as np
import mindspore as ms
from mindspore import ops
from mindspore.communication import get_group_size, get_rank, init

ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
init()
rank, size = get_rank(), get_group_size()
y = ops.AllReduce()(ms.Tensor(np.full(4, rank + 1, dtype=np.float32)))
ok = bool((y.asnumpy() == size * (size + 1) / 2).all()) and hccn_ms.rank() == rank
print(f"[msrun] rank {rank} of {size}: {'ok' if ok else 'WRONG ' + str(y)}", flush=True)
