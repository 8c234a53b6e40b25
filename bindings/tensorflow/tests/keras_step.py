"""Data-parallel Keras training whose gradients are averaged through hccn, compared with the same
training in one process on the whole batch.

Each rank starts from its own random weights, takes rank 0's through hccn_tf.broadcast_variables,
then runs STEPS SGD steps (a tf.function train step) on its shard of a fixed global batch, with
gradients averaged by hccn_tf.average_gradients. Alongside, every rank trains a copy of the model
in-process on the whole global batch (no hccn). Checked:
- after every step the replicas' weights are bit-identical across ranks (allgathered and compared);
- after the last step they match the single-process model within TOL (float32 sums in another
  order: per-shard means averaged instead of one mean over the batch).

Run: PYTHONPATH=<build.sh --out> hccnrun -n 2 /opt/hccn/venvs/tf/bin/python keras_step.py
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import hccn_tf  # noqa: E402

STEPS = 8
GLOBAL_BATCH = 64
LR = 0.1
TOL = 1e-5  # max abs difference of any weight after STEPS steps

hccn_tf.init()
r, n = hccn_tf.rank(), hccn_tf.size()
assert GLOBAL_BATCH % n == 0


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16, activation="tanh"),
        keras.layers.Dense(4),
    ])


rng = np.random.default_rng(7)
x_all = rng.standard_normal((GLOBAL_BATCH, 8)).astype(np.float32)
y_all = rng.standard_normal((GLOBAL_BATCH, 4)).astype(np.float32)
shard = GLOBAL_BATCH // n
x_mine, y_mine = x_all[r * shard:(r + 1) * shard], y_all[r * shard:(r + 1) * shard]

def flat(m):
    return np.concatenate([w.reshape(-1) for w in m.get_weights()])


def same_on_every_rank(m):
    everyone = hccn_tf.allgather(flat(m).reshape(1, -1)).numpy()
    return all(np.array_equal(everyone[0], everyone[k]) for k in range(n))


failed = False
model = make_model(1000 + r)  # different on every rank until the broadcast
if n > 1 and same_on_every_rank(model):
    print(f"FAIL rank {r}: the ranks' initial weights should differ before the broadcast", flush=True)
    failed = True
hccn_tf.broadcast_variables(model.trainable_variables, root_rank=0)
reference = make_model(0)
reference.set_weights(model.get_weights())

opt = keras.optimizers.SGD(learning_rate=LR)
ref_opt = keras.optimizers.SGD(learning_rate=LR)
mse = keras.losses.MeanSquaredError()


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
    ref_loss = float(reference_step(x_all, y_all))
    same = same_on_every_rank(model)
    if r == 0:
        print(f"step {step}: loss {loss:.6f} (single process {ref_loss:.6f})", flush=True)
    if not same:
        print(f"FAIL rank {r}: step {step}: the replicas' weights differ across ranks", flush=True)
        failed = True

diff = float(np.max(np.abs(flat(model) - flat(reference))))
if diff > TOL:
    print(f"FAIL rank {r}: max abs weight difference {diff:.3g} > {TOL}", flush=True)
    failed = True
print(f"[keras] rank {r} of {n}: {STEPS} steps, max abs difference from one process {diff:.3g} "
      f"(tolerance {TOL}){' FAILED' if failed else ' ok'}", flush=True)
sys.exit(1 if failed else 0)
