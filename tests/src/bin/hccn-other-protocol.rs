//! A rank of another hccn protocol (run by tests/tests/lifecycle.rs under hccnrun): publishes
//! the record given as its argument under its rank's key in the job's first world, as such a
//! build would, prints `PUBLISHED`, then waits to be stopped, reading nothing it could not
//! understand anyway.

use std::process::ExitCode;
use std::time::Duration;

use hccn_runtime::config::Meet;
use hccn_runtime::rendezvous::runs;
use hccn_runtime::{Config, LaunchEnv};

fn publish(record: &str) -> Result<(), String> {
    let env = LaunchEnv::from_env().map_err(|e| e.to_string())?;
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    let Meet::Store(store) = &env.meet else { return Err("needs hccnrun's store".into()) };
    let store = store.connect(&env.job_token, cfg.timeout).map_err(|e| e.to_string())?;
    // The embedded store holds one run, generation 1 (rendezvous/runs.rs).
    let world = runs::world_prefix(&runs::job_root(&env.job_id), 1, 0);
    store.set(&format!("{world}/addr/{}", env.rank), record.as_bytes()).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let record = std::env::args().nth(1).unwrap_or_default();
    if let Err(e) = publish(&record) {
        eprintln!("FAILED {e}");
        return ExitCode::FAILURE;
    }
    println!("PUBLISHED");
    // hccnrun stops this process once the others fail; the test's timeout bounds it anyway.
    std::thread::sleep(Duration::from_secs(60));
    ExitCode::SUCCESS
}
