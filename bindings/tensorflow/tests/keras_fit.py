"""Keras model.fit with Horovod's API (hccn_tf.keras) on n ranks equals model.fit in one process.

Each rank builds its model with its own seed (so the ranks start apart), takes every n-th sample
of a fixed dataset from its rank on (tf.data's Dataset.shard(n, r)) and fits with a batch of
GLOBAL_BATCH / n through hccn_tf.keras.DistributedOptimizer, with
BroadcastGlobalVariablesCallback(0) and MetricAverageCallback. Step k of rank r then takes
samples k*G + r, k*G + r + n, ...: together the ranks' step k covers the global batch k*G ..
(k+1)*G - 1, and the average of their mean-loss gradients is the gradient of the mean loss over
that global batch. So one process fitting the whole dataset with batch GLOBAL_BATCH from rank 0's
initial weights, at the same learning rate, makes the same updates. Checked on every rank:
- before fit the ranks' weights differ; after it they are bit-identical across ranks;
- weights and optimizer state (SGD momentum) match the single-process fit within TOL (max abs);
- History's epoch loss and metric (averaged by MetricAverageCallback) match the single process's;
- local_rank() and local_size() under hccnrun on one host: the rank and n.
Then the same without Keras' fit: a hand-written tf.function train step whose gradients go
through hccn_tf.average_gradients (after hccn_tf.broadcast_variables), STEPS SGD steps on the
shards; the replicas are bit-identical across ranks after every step and within TOL of the
single process on the global batch after the last.

Run: PYTHONPATH=<build.sh --out> hccnrun -n N /opt/hccn/venvs/tf/bin/python keras_fit.py
(N divides GLOBAL_BATCH: 1, 2, 3, 4, 6 or 12).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import hccn_tf  # noqa: E402
import hccn_tf.keras as hvd  # noqa: E402

SAMPLES = 48
GLOBAL_BATCH = 12
EPOCHS = 2
TOL = 1e-5

hvd.init()
r, n = hvd.rank(), hvd.size()
assert GLOBAL_BATCH % n == 0, f"{n} ranks do not divide the global batch of {GLOBAL_BATCH}"
failed = []


def fail(what):
    failed.append(what)
    print(f"FAIL rank {r}: {what}", flush=True)


def make_model(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16, activation="tanh"),
        keras.layers.Dense(4),
    ])
    return model


def flat(values):
    return np.concatenate([np.asarray(v).reshape(-1).astype(np.float64) for v in values])


def on_every_rank(vector):
    return hccn_tf.allgather(tf.constant(vector.reshape(1, -1))).numpy()


rng = np.random.default_rng(7)
x_all = rng.standard_normal((SAMPLES, 8)).astype(np.float32)
y_all = rng.standard_normal((SAMPLES, 4)).astype(np.float32)

if (hvd.local_rank(), hvd.local_size()) != (r, n):
    fail(f"local_rank/local_size {hvd.local_rank()}/{hvd.local_size()} on one host, want {r}/{n}")

# The distributed fit: rank r's shard, every rank starting from its own weights.
model = make_model(1000 + r)
start = flat(model.get_weights())
if n > 1 and all(np.array_equal(row, start) for row in on_every_rank(start)):
    fail("the ranks' initial weights should differ before the broadcast")
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.1, momentum=0.9))
model.compile(optimizer=opt, loss="mse", metrics=["mae"])
history = model.fit(
    x_all[r::n],
    y_all[r::n],
    batch_size=GLOBAL_BATCH // n,
    epochs=EPOCHS,
    shuffle=False,
    verbose=0,
    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()],
)

# One process: rank 0's initial weights, the whole dataset, the global batch.
reference = make_model(1000)
if r == 0 and not np.array_equal(flat(reference.get_weights()), start):
    fail("the single-process model does not start from rank 0's weights")
reference.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1, momentum=0.9), loss="mse", metrics=["mae"])
ref_history = reference.fit(x_all, y_all, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0)

weights = flat(model.get_weights())
if not all(np.array_equal(row, weights) for row in on_every_rank(weights)):
    fail("after fit the replicas' weights differ across ranks")
diff = float(np.max(np.abs(weights - flat(reference.get_weights()))))
if diff > TOL:
    fail(f"max abs weight difference from one process {diff:.3g} > {TOL}")
momentum = [v for v in opt.variables if "momentum" in v.path]
ref_momentum = [v for v in reference.optimizer.variables if "momentum" in v.path]
if len(momentum) != 4 or len(momentum) != len(ref_momentum):
    fail(f"momentum slots: {len(momentum)} here, {len(ref_momentum)} in the single process")
elif float(np.max(np.abs(flat(momentum) - flat(ref_momentum)))) > TOL:
    fail("the optimizer's momentum differs from the single process's")
if int(opt.iterations.numpy()) != EPOCHS * SAMPLES // GLOBAL_BATCH:
    fail(f"{int(opt.iterations.numpy())} optimizer steps, want {EPOCHS * SAMPLES // GLOBAL_BATCH}")
for key in ("loss", "mae"):
    got, want = history.history[key], ref_history.history[key]
    if len(got) != EPOCHS or max(abs(a - b) for a, b in zip(got, want)) > TOL:
        fail(f"epoch {key} {got} differs from the single process's {want}")
    if r == 0:
        print(f"{key} per epoch: {['%.6f' % v for v in got]} (single process {['%.6f' % v for v in want]})")



# A hand-written train step: hccn_tf.broadcast_variables and hccn_tf.average_gradients.
STEPS = 8
model = make_model(2000 + r)
hccn_tf.broadcast_variables(model.trainable_variables, root_rank=0)
reference = make_model(0)
reference.set_weights(model.get_weights())
opt, ref_opt = keras.optimizers.SGD(learning_rate=0.1), keras.optimizers.SGD(learning_rate=0.1)
mse = keras.losses.MeanSquaredError()
x_mine, y_mine = x_all[:GLOBAL_BATCH][r::n], y_all[:GLOBAL_BATCH][r::n]


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = mse(y, model(x, training=True))
    grads = hccn_tf.average_gradients(tape.gradient(loss, model.trainable_variables))
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return hccn_tf.allreduce(loss, op="average")


@tf.function
def reference_step(x, y):
    with tf.GradientTape() as tape:
        loss = mse(y, reference(x, training=True))
    grads = tape.gradient(loss, reference.trainable_variables)
    ref_opt.apply_gradients(zip(grads, reference.trainable_variables))
    return loss


for step in range(STEPS):
    loss = float(train_step(x_mine, y_mine))
    ref_loss = float(reference_step(x_all[:GLOBAL_BATCH], y_all[:GLOBAL_BATCH]))
    weights = flat(model.get_weights())
    if not all(np.array_equal(row, weights) for row in on_every_rank(weights)):
        fail(f"train step {step}: the replicas' weights differ across ranks")
    if r == 0:
        print(f"step {step}: loss {loss:.6f} (single process {ref_loss:.6f})", flush=True)
step_diff = float(np.max(np.abs(flat(model.get_weights()) - flat(reference.get_weights()))))
if step_diff > TOL:
    fail(f"train steps: max abs weight difference from one process {step_diff:.3g} > {TOL}")

print(f"[keras] rank {r} of {n}: fit {EPOCHS} epochs of {SAMPLES // GLOBAL_BATCH} steps and {STEPS} train steps, "
      f"max abs difference from one process {max(diff, step_diff):.3g} (tolerance {TOL})"
      f"{' FAILED' if failed else ' ok'}", flush=True)
sys.exit(1 if failed else 0)
