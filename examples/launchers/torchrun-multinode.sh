#!/bin/bash
# hccn under torchrun on two hosts: run this on each, with NODE_RANK=0 on the host whose address
# is MASTER_ADDR and NODE_RANK=1 on the other. torchrun binds MASTER_PORT for torch's own store;
# hccn's rank 0 hosts hccn's store on MASTER_ADDR, port MASTER_PORT+53. Both ports must be
# reachable from the other host.
set -euo pipefail
: "${MASTER_ADDR:?the address of the NODE_RANK=0 host}"
: "${NODE_RANK:?0 or 1}"
MASTER_PORT=${MASTER_PORT:-29500}

# A C program (no Python): --no-python runs it as is.
torchrun --nnodes 2 --node-rank "$NODE_RANK" --nproc-per-node 4 \
  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" --no-python ./allreduce

# A torch program on the hccn backend: dist.init_process_group("hccn") (examples/pytorch).
# torchrun --nnodes 2 --node-rank "$NODE_RANK" --nproc-per-node 4 \
#   --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" ../pytorch/ddp_cnn.py
