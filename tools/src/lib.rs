//! The hccn command-line tools: `hccnrun` (the local launcher) and `hccn-perf` (the
//! nccl-tests style benchmark). The binaries are thin wrappers around [`launch::main`] and
//! [`perf::main`].

pub mod args;
pub mod etcd_local;
pub mod launch;
pub mod perf;
