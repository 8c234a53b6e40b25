//! TensorFlow, for real: bindings/tensorflow/build.sh builds the op library (HccnAllreduce,
//! HccnAllgather, HccnBroadcast) against the tensorflow-cpu in /opt/hccn/venvs/tf with
//! tf.sysconfig's flags; then 2 ranks under hccnrun run
//! - bindings/tensorflow/tests/collectives.py: every op and dtype, eager and in tf.function,
//!   gradients and errors, each value checked exactly;
//! - bindings/tensorflow/tests/keras_fit.py, on 2 and on 3 ranks: Keras `model.fit` with
//!   Horovod's API (hccn_tf.keras.DistributedOptimizer, BroadcastGlobalVariablesCallback(0),
//!   MetricAverageCallback), each rank on its shard: weights, optimizer state and epoch logs
//!   within 1e-5 of `model.fit` in one process on the whole data; then a hand-written train
//!   step with hccn_tf.average_gradients, equal across ranks bit for bit after every step and
//!   within 1e-5 of the single-process run;
//! - bindings/tensorflow/tests/timeout.py: `hccn_tf.init(timeout_seconds=3)` ends the wait for
//!   a rank that never enters the collective after 3 s, although HCCN_TIMEOUT_MS says 120 s.
//!
//! Needs the release build and the venv (`bash scripts/setup-frameworks.sh tf`, which
//! scripts/test.sh runs).

use std::time::Duration;

use hccn_tests::framework::Framework;
use hccn_tests::scratch::TempDir;

const TF: Framework = Framework {
    python: "/opt/hccn/venvs/tf/bin/python",
    dir: "tensorflow",
    build_args: &["--python", "/opt/hccn/venvs/tf/bin/python"],
    // Compiling against TensorFlow's headers takes about a minute on a quiet machine.
    build_timeout: Duration::from_secs(600),
    env: &[("TF_CPP_MIN_LOG_LEVEL", "2")],
};

#[test]
fn tensorflow_ops_give_exact_results_on_two_ranks() {
    TF.expect_ranks_ok("collectives.py", "tf", "checks ok");
}

#[test]
fn keras_fit_with_horovods_api_on_2_ranks_matches_one_process() {
    TF.expect_training_matches(2, "keras_fit.py", "keras");
}

#[test]
fn keras_fit_with_horovods_api_on_3_ranks_matches_one_process() {
    TF.expect_training_matches(3, "keras_fit.py", "keras");
}

#[test]
fn init_timeout_seconds_bounds_the_wait_for_a_rank_that_never_comes() {
    let dir = TempDir::new("tf-timeout");
    let shared = dir.path().display().to_string();
    let out = TF.expect_ranks_ok_on(2, "timeout.py", &["3", &shared], "tftimeout", " ok");
    assert!(out.stdout.contains("[tftimeout] rank 0 of 2: timed out after "), "{}", out.describe());
}
