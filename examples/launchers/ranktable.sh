#!/bin/bash
# hccn on Ascend NPUs with an HCCL rank table (hccl.json, version 1.0 or 1.2), started the way
# MindSpore's and torch_npu's rank-table scripts start ranks: one process per device, each with
# RANK_ID. The table gives the world size, each rank's server and NPU (device_id, which
# HCCN_BACKEND=hccl binds with aclrtSetDevice); rank 0 hosts the store on its server (loopback
# for a one-server table) on a port derived from the table. On each server of a larger table,
# start the ranks whose rank_id that server holds.
set -euo pipefail
export RANK_TABLE_FILE=${RANK_TABLE_FILE:-$PWD/hccl.json}
export HCCN_BACKEND=hccl
for rank in 0 1 2 3; do
  RANK_ID=$rank ./allreduce &
done
wait
