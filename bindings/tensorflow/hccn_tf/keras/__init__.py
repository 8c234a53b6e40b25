"""Horovod's Keras API over hccn, for Keras 3 on TensorFlow (``model.fit`` as it is).

    import keras, hccn_tf.keras as hvd              # the names Horovod users know

    hvd.init()                                       # the job hccnrun started
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))
    model.compile(optimizer=opt, loss="mse")
    model.fit(x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()], batch_size=B // hvd.size(),
              shuffle=False, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                        hvd.callbacks.MetricAverageCallback()],
              verbose=1 if hvd.rank() == 0 else 0)

With each rank on every size()-th sample (tf.data's ``Dataset.shard(size, rank)``), a per-rank
batch of B / size and the gradients averaged, each step is the step of one process on the
global batch of B: the training equals one process's with batch B and the same learning rate
(up to float rounding). Horovod's advice to scale the learning rate by size() is for the other
choice, keeping the single process's batch on every rank (a global batch size() times larger).
"""

import keras

import hccn_tf
from hccn_tf import init, local_rank, local_size, rank, shutdown, size

from . import callbacks

__all__ = [
    "init",
    "shutdown",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "DistributedOptimizer",
    "callbacks",
]

_OPS = ("average", "sum")
_classes = {}


class _Distributed:
    """Mixed into the user's optimizer class: gradients are reduced across ranks before the
    update. Keras 3 funnels ``apply_gradients`` and ``model.fit``'s updates through ``apply``."""

    _hccn_op = "average"

    def apply(self, grads, trainable_variables=None):
        grads = [None if g is None else _reduce(g, self._hccn_op) for g in grads]
        return super().apply(grads, trainable_variables)


def _reduce(grad, op):
    import tensorflow as tf

    if isinstance(grad, tf.IndexedSlices):  # embeddings: reduced dense (Horovod's sparse_as_dense)
        grad = tf.convert_to_tensor(grad)
    return hccn_tf.allreduce(grad, op=op)


def DistributedOptimizer(optimizer, name=None, op="average"):  # noqa: N802 - Horovod's name
    """An optimizer of the same class and configuration as `optimizer` that averages (op="sum":
    sums) each gradient over all ranks, in variable order, before applying it. Every rank must
    wrap the same optimizer and train the same model. As in Horovod, a new optimizer is made from
    `optimizer.get_config()`: pass a fresh one (its state, if any, is not carried over)."""
    if op not in _OPS:
        raise ValueError(f"op must be one of {_OPS}, not {op!r}")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer takes a keras.optimizers.Optimizer, not {type(optimizer).__name__}")
    init()
    base = type(optimizer)
    cls = _classes.get(base)
    if cls is None:
        cls = _classes[base] = type(base.__name__, (_Distributed, base), {"__module__": base.__module__})
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    distributed = cls.from_config(config)
    distributed._hccn_op = op
    return distributed
