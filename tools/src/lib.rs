//! The hccn command-line tools: `hccnrun` (the local launcher), `hccn-perf` (the nccl-tests
//! style benchmark), `hccn-trace` (pictures and a summary of `HCCN_TRACE` files) and `hccn-info`
//! (hosts, links, algorithms). The binaries are thin wrappers around [`launch::main`],
//! [`perf::main`], [`trace::main`] and [`info::main`].

pub mod args;
pub mod etcd_local;
pub mod info;
pub mod launch;
pub mod perf;
pub mod trace;
