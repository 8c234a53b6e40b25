//! MindSpore, for real: bindings/mindspore/build.sh builds the AOT shim (functions with the
//! ops.Custom(func_type="aot") signature that call hccn on host buffers); then 2 ranks under
//! hccnrun run, in the mindspore CPU wheel of /opt/hccn/venvs/mindspore (PyNative mode),
//! - bindings/mindspore/tests/collectives.py: the AllReduce/AllGather/Broadcast cells over
//!   their dtypes and ops, gradients and errors, each value checked exactly;
//! - bindings/mindspore/tests/train_step.py: SGD steps with gradients averaged through hccn,
//!   equal across ranks bit for bit and within 1e-5 of the single-process run.
//!
//! Needs the release build and the venv (`bash scripts/setup-frameworks.sh mindspore`, which
//! scripts/test.sh runs).

use std::time::Duration;

use hccn_tests::framework::Framework;

const MINDSPORE: Framework = Framework {
    python: "/opt/hccn/venvs/mindspore/bin/python",
    dir: "mindspore",
    build_args: &[],
    build_timeout: Duration::from_secs(300),
    env: &[],
};

#[test]
fn mindspore_cells_give_exact_results_on_two_ranks() {
    MINDSPORE.expect_ranks_ok("collectives.py", "mindspore", "checks ok");
}

#[test]
fn mindspore_training_step_with_hccn_gradients_matches_one_process() {
    MINDSPORE.expect_training_matches("train_step.py", "mindspore-train");
}
