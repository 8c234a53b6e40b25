//! torch.distributed's own timeout on hccn: `init_process_group("hccn", timeout=3 s)` bounds the
//! backend's waits, under torchrun (the communicator made through torch's store) and under
//! hccnrun (where the world joined at import keeps HCCN_TIMEOUT_MS, so the group gets a
//! communicator of its own). Rank 1 never enters the all_reduce; rank 0's wait must end with
//! hccn's TimeoutError after about 3 s, although HCCN_TIMEOUT_MS says 120 s
//! (bindings/python/tests/torch_timeout.py checks the time and the error class).

use std::time::Duration;

use hccn_tests::scratch::TempDir;
use hccn_tests::torch::{self, expect_ok};

const TIMEOUT: Duration = Duration::from_secs(300);

fn run(under_hccnrun: bool) {
    let dir = TempDir::new("torch-timeout");
    let shared = dir.path().display().to_string();
    let script = torch::root().join("bindings/python/tests/torch_timeout.py");
    let args = ["3", shared.as_str()];
    let out = if under_hccnrun {
        torch::hccnrun(2, &[], &script, &args, TIMEOUT)
    } else {
        torch::torchrun(2, &script, &args, TIMEOUT)
    };
    let how = if under_hccnrun { "hccnrun" } else { "torchrun" };
    expect_ok(&out, 2, &format!("torch_timeout.py under {how}"));
    let verdict = out.stdout.lines().find(|l| l.contains("rank 0 of 2: ok")).unwrap_or_default();
    eprintln!("{how}: {verdict}");
}

#[test]
fn init_process_group_timeout_bounds_the_wait_under_torchrun() {
    run(false);
}

#[test]
fn init_process_group_timeout_bounds_the_wait_under_hccnrun() {
    run(true);
}
