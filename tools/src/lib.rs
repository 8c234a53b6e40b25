//! The hccn command-line tools: `hccnrun` (the local launcher), `hccn-perf` (the nccl-tests
//! style benchmark), `hccn-trace` (pictures and a summary of `HCCN_TRACE` files) and `hccn-info`
//! (hosts, links, algorithms). The binaries are thin wrappers around [`launch::main`],
//! [`perf::main`], [`trace::main`] and [`info::main`].

pub mod args;
pub mod etcd_local;
pub mod hostfile;
pub mod info;
pub mod launch;
pub mod perf;
pub mod resources;
pub mod trace;
pub mod world;

use hccn_runtime::BackendComm;

/// `--version` of every tool: its name and the package's version, on stdout; the exit code.
pub fn print_version(tool: &str) -> i32 {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{tool} {}", env!("CARGO_PKG_VERSION"));
    0
}

/// What every tool that runs as a rank does first: read the configuration, start logging, make
/// etcd stores and the HCCL backend usable, and join the job hccnrun describes in the
/// environment, on the backend `HCCN_BACKEND` names.
pub fn join_job() -> Result<Box<dyn BackendComm>, String> {
    join_job_with(|_| {})
}

/// [`join_job`] with the configuration adjusted by `adjust` (a tool's options over HCCN_*).
pub fn join_job_with(adjust: impl FnOnce(&mut hccn_runtime::Config)) -> Result<Box<dyn BackendComm>, String> {
    let mut cfg = hccn_runtime::Config::from_env().map_err(|e| e.to_string())?;
    adjust(&mut cfg);
    hccn_runtime::log::init(&cfg);
    hccn_recovery::install();
    hccn_backend_hccl::install();
    let env = hccn_runtime::LaunchEnv::from_env().map_err(|e| e.to_string())?;
    hccn_runtime::backend::init_from_env(&env, &cfg).map_err(|e| format!("rank {}: cannot join the job: {e}", env.rank))
}
