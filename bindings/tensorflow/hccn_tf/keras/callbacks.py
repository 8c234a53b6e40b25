"""Horovod's Keras callbacks over hccn: the same start on every rank, and epoch logs averaged."""

import numbers

import keras
import numpy as np
import tensorflow as tf

import hccn_tf


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Gives every rank `root_rank`'s model variables (weights, non-trainable state, random
    seeds) and optimizer variables (iterations, slots) when training starts, so that ranks whose
    models were initialised differently, or restored only on the root, train the same replica.

    The broadcast happens in on_train_begin when the model is built by then (a model with an
    Input, or one that has run), after building the optimizer's slots, so the first step already
    starts from the root's state; a model built only by its first batch gets the broadcast after
    that batch, as in Horovod (its first step then started from each rank's own weights).
    """

    def __init__(self, root_rank=0):
        super().__init__()
        self.root_rank = int(root_rank)
        self.done = False

    def on_train_begin(self, logs=None):
        if self.model.built:
            optimizer = self.model.optimizer
            if optimizer is not None and not optimizer.built:
                optimizer.build(self.model.trainable_variables)
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self.done:
            self._broadcast()

    def _broadcast(self):
        if self.root_rank >= hccn_tf.size() or self.root_rank < 0:
            raise ValueError(f"root_rank {self.root_rank} is not a rank of this job of {hccn_tf.size()}")
        hccn_tf.broadcast_variables(self.model.variables, root_rank=self.root_rank)
        if self.model.optimizer is not None:
            hccn_tf.broadcast_variables(self.model.optimizer.variables, root_rank=self.root_rank)
        self.done = True


def _is_scalar(v):
    if isinstance(v, numbers.Number):
        return True
    return isinstance(v, (np.ndarray, np.generic, tf.Tensor)) and np.ndim(v) == 0


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces each number in the epoch's logs (loss, metrics, validation figures) with its
    average over the ranks, in place, so later callbacks (History, ModelCheckpoint,
    EarlyStopping, ...) see the same values on every rank. List it before them. With equal
    batches on every rank the averaged epoch loss is the one-process loss over all their data.
    (Keras prints its progress bar before any callback runs: that line shows the rank's own
    figures.)"""

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if _is_scalar(v))
        if not keys:
            return
        values = tf.constant([float(logs[k]) for k in keys], dtype=tf.float64)
        averaged = hccn_tf.allreduce(values, op="average").numpy()
        for k, v in zip(keys, averaged):
            logs[k] = float(v)
