"""Data-parallel training as MindSpore's distributed-training tutorial writes it; the one line
added for hccn is the first import.

    PYTHONPATH=<build.sh --out> hccnrun -n 2 -- python data_parallel.py [pynative|graph] [loop|model|sink]

loop:  value_and_grad + nn.DistributedGradReducer, the tutorial's training loop;
model: mindspore.train.Model(...).train(...), which adds the reducer itself;
sink:  the same with dataset_sink_mode=True.
Each rank trains on its shard of the dataset (num_shards/shard_id) and prints its losses and a
checksum of its final weights, the same on every rank.
"""

import hccn_ms  # noqa: F401 - hccn carries MindSpore's collectives

import sys

import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.train import LossMonitor, Model

mode = sys.argv[1] if len(sys.argv) > 1 else "pynative"
style = sys.argv[2] if len(sys.argv) > 2 else "loop"

ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
ms.set_device("CPU")
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
init()
ms.set_seed(1)


def create_dataset(batch_size):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 32)).astype(np.float32)
    y = x[:, :10].argmax(axis=1).astype(np.int32)
    dataset = ds.NumpySlicesDataset(
        {"data": x, "label": y}, shuffle=False, num_shards=get_group_size(), shard_id=get_rank()
    )
    return dataset.batch(batch_size)


class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense_relu_sequential = nn.SequentialCell(nn.Dense(32, 64), nn.ReLU(), nn.Dense(64, 10))

    def construct(self, x):
        return self.dense_relu_sequential(x)


data_set = create_dataset(16)
net = Network()
loss_fn = nn.CrossEntropyLoss()
optimizer = nn.SGD(net.trainable_params(), 1e-2)

if style == "loop":

    def forward_fn(data, label):
        logits = net(data)
        loss = loss_fn(logits, label)
        return loss, logits

    grad_fn = ms.value_and_grad(forward_fn, None, net.trainable_params(), has_aux=True)
    grad_reducer = nn.DistributedGradReducer(optimizer.parameters)
    for epoch in range(2):
        for i, (data, label) in enumerate(data_set):
            (loss, _), grads = grad_fn(data, label)
            grads = grad_reducer(grads)
            optimizer(grads)
            if i % 4 == 0:
                print(f"epoch: {epoch}, step: {i}, loss is {loss}", flush=True)
else:
    model = Model(net, loss_fn=loss_fn, optimizer=optimizer)
    model.train(2, data_set, callbacks=[LossMonitor(4)], dataset_sink_mode=style == "sink")

weights = np.concatenate([p.asnumpy().ravel() for p in net.trainable_params()])
print(f"rank {get_rank()} of {get_group_size()}: weights checksum {weights.astype(np.float64).sum():.9f}", flush=True)
