//! TensorFlow, for real: bindings/tensorflow/build.sh builds the op library (HccnAllreduce,
//! HccnAllgather, HccnBroadcast) against the tensorflow-cpu in /opt/hccn/venvs/tf with
//! tf.sysconfig's flags; then 2 ranks under hccnrun run
//! - bindings/tensorflow/tests/collectives.py: every op and dtype, eager and in tf.function,
//!   gradients and errors, each value checked exactly;
//! - bindings/tensorflow/tests/keras_step.py: Keras SGD steps with gradients averaged through
//!   hccn, equal across ranks bit for bit and within 1e-5 of the single-process run.
//!
//! Needs the release build and the venv (`bash scripts/setup-frameworks.sh tf`, which
//! scripts/test.sh runs).

use std::time::Duration;

use hccn_tests::framework::Framework;

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
fn keras_training_step_with_hccn_gradients_matches_one_process() {
    TF.expect_training_matches("keras_step.py", "keras");
}
