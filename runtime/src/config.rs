//! Every `HCCN_*` environment variable, parsed in one place. [`VARIABLES`] is the table the
//! README reproduces (a test keeps the two in step).

use std::net::IpAddr;
use std::time::Duration;

use crate::collectives::select::AlgoChoice;
use crate::error::{Error, Result};
use crate::rendezvous::StoreAddr;

/// One documented variable: name, default (as text), meaning.
#[derive(Debug, Clone, Copy)]
pub struct Variable {
    pub name: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
}

pub const VARIABLES: &[Variable] = &[
    Variable { name: "HCCN_RANK", default: "(set by hccnrun)", meaning: "This process's rank in the world communicator (`hccn_init_from_env`)." },
    Variable { name: "HCCN_WORLD_SIZE", default: "(set by hccnrun)", meaning: "Number of ranks in the world communicator." },
    Variable { name: "HCCN_LOCAL_RANK", default: "`HCCN_RANK`", meaning: "Rank among the processes on this host." },
    Variable { name: "HCCN_LOCAL_WORLD_SIZE", default: "`HCCN_WORLD_SIZE`", meaning: "Number of ranks on this host." },
    Variable { name: "HCCN_STORE", default: "(set by hccnrun)", meaning: "Rendezvous store, `tcp://host:port` (the embedded store hosted by hccnrun)." },
    Variable { name: "HCCN_JOB_ID", default: "`default`", meaning: "Job name; namespaces the job's keys in the store." },
    Variable { name: "HCCN_JOB_TOKEN", default: "(empty)", meaning: "Shared secret for the HMAC-SHA256 challenge-response on every store and peer connection; hccnrun makes a fresh one per job." },
    Variable { name: "HCCN_TIMEOUT_MS", default: "`30000`", meaning: "Deadline of every wait (connect, rendezvous, each receive); exceeded waits fail with `HCCN_ERROR_TIMEOUT`. Like `HCCL_EXEC_TIMEOUT`, in ms." },
    Variable { name: "HCCN_BIND_ADDR", default: "`127.0.0.1`", meaning: "Address that ranks and the embedded store listen on (never all interfaces unless asked)." },
    Variable { name: "HCCN_CHUNK_BYTES", default: "`524288`", meaning: "Largest pipeline chunk of the algorithms (4 KiB .. 8 MiB); the cost model may choose smaller chunks per operation." },
    Variable { name: "HCCN_ALGO", default: "`auto`", meaning: "Algorithm of the collectives that have a choice (allreduce above all): `auto` (the cost model decides per operation), `ring`, `rhd` (recursive halving-doubling), `tree`, `hier`; see docs/algorithms.md. An algorithm that cannot run an allreduce on the communicator is an error." },
    Variable { name: "HCCN_HEARTBEAT_MS", default: "`100`", meaning: "Interval of the heartbeat each rank sends on every connection; `0` turns heartbeats (and silence detection) off." },
    Variable { name: "HCCN_DEAD_AFTER_MS", default: "`800`", meaning: "A peer silent this long (no frame, no heartbeat, nothing waiting in its socket) is declared failed: a frozen process or a cut link. Raise it where ranks may stall longer without being dead (dead versus slow)." },
    Variable { name: "HCCN_LEASE_TTL_S", default: "`2`", meaning: "With an etcd store, each world communicator's membership key lives on a lease of this many seconds, kept alive in the background: a backstop that declares a rank failed when its process dies or freezes, even with heartbeats off (1 .. 3600; etcd may round it up)." },
    Variable { name: "HCCN_TRACE", default: "(off)", meaning: "Directory where each rank writes a Chrome trace-event file `hccn-trace-<job>-<rank>.json` (one event per operation and per transfer); see docs/observability.md." },
    Variable { name: "HCCN_TRANSPORT", default: "`auto`", meaning: "Data transport between ranks: `auto` (shared memory between ranks on one host, TCP between hosts), `tcp` (TCP everywhere), `shm` (shared memory, and an error if a peer is on another host). TCP always stays for control and failure detection." },
    Variable { name: "HCCN_CMA", default: "`auto`", meaning: "Single-copy reads of large shared-memory messages with `process_vm_readv` (cross-memory attach): `auto` (used between two ranks when a probe at connection shows the kernel permits it) or `off` (every byte goes through the shared-memory rings)." },
    Variable { name: "HCCN_LOG", default: "`warn`", meaning: "Log filter (`error`, `warn`, `info`, `debug`, `trace`, or tracing's `target=level` list); logs go to stderr." },
    Variable { name: "HCCN_BACKEND", default: "`native`", meaning: "Data path of new communicators: `native` (hccn's TCP runtime) or `hccl` (Huawei HCCL on Ascend NPUs, loaded at run time; see docs/hccl.md)." },
    Variable { name: "HCCN_HCCL_LIB", default: "(search)", meaning: "Path of `libhccl.so` for `HCCN_BACKEND=hccl`; else `$ASCEND_HOME_PATH/lib64`, `$ASCEND_TOOLKIT_HOME/lib64`, then the loader's search path." },
    Variable { name: "HCCN_ACL_LIB", default: "(search)", meaning: "Path of `libascendcl.so` for `HCCN_BACKEND=hccl`; searched like `HCCN_HCCL_LIB`." },
    Variable { name: "HCCN_DEVICE_ID", default: "`HCCN_LOCAL_RANK`", meaning: "NPU that this process binds with `aclrtSetDevice` (`HCCN_BACKEND=hccl`); else the local rank, else 0." },
    Variable { name: "HCCN_LIB", default: "(next to the package)", meaning: "Path of the `libhccn.so` that the Python package `hccn` loads (read by bindings/python only)." },
];

/// Default link and kernel costs of the algorithm selection's model (`collectives::select`),
/// measured on the 2-core development machine: per-message latency in µs and bandwidth in GB/s.
/// TCP over loopback pays a blocked receiver's wake-up (~50 µs) per message.
pub const TCP_ALPHA_US: f64 = 50.0;
pub const TCP_GBPS: f64 = 2.5;
/// Shared memory between ranks of one host (spinning flags, one copy).
pub const SHM_ALPHA_US: f64 = 1.0;
pub const SHM_GBPS: f64 = 8.0;
/// A rank's frames to itself.
pub const LOCAL_ALPHA_US: f64 = 0.5;
pub const LOCAL_GBPS: f64 = 10.0;
/// The reduction kernels (f32 sum, out of cache).
pub const REDUCE_GBPS: f64 = 8.0;

/// Largest frame payload a peer may send; any larger header closes the connection.
pub const MAX_CHUNK_BYTES: usize = 8 << 20;
const MIN_CHUNK_BYTES: usize = 4 << 10;

/// Which transport carries data between ranks of one host (`HCCN_TRANSPORT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// Shared memory with peers on this host, TCP with the others.
    #[default]
    Auto,
    Tcp,
    /// Shared memory only: a peer on another host is an error.
    Shm,
}

/// Settings that apply to every communicator created by this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub timeout: Duration,
    pub bind_addr: IpAddr,
    pub chunk_bytes: usize,
    /// `HCCN_ALGO`: the algorithm forced on collectives that have a choice, or the cost model.
    pub algo: AlgoChoice,
    /// Heartbeat interval; zero disables heartbeats and silence detection.
    pub heartbeat: Duration,
    /// Silence after which a peer is declared failed.
    pub dead_after: Duration,
    /// TTL of the etcd lease behind each membership key.
    pub lease_ttl: Duration,
    pub log: String,
    /// `HCCN_JOB_ID` when set (the launcher keeps a given job name).
    pub job_id: Option<String>,
    /// `HCCN_JOB_TOKEN` when set (launchers on several hosts must share one).
    pub job_token: Option<String>,
    /// `HCCN_TRACE`: directory for this process's trace file; `None` records nothing.
    pub trace: Option<std::path::PathBuf>,
    /// `HCCN_BACKEND`: the data path of new communicators.
    pub backend: Backend,
    /// `HCCN_HCCL_LIB` / `HCCN_ACL_LIB`: explicit library paths for the HCCL backend.
    pub hccl_lib: Option<std::path::PathBuf>,
    pub acl_lib: Option<std::path::PathBuf>,
    /// `HCCN_DEVICE_ID`, else `HCCN_LOCAL_RANK`: the NPU of this process on the HCCL backend.
    pub device_id: Option<i32>,
    /// `HCCN_TRANSPORT`.
    pub transport: Transport,
    /// `HCCN_CMA`: may large shared-memory messages be read with process_vm_readv?
    pub cma: bool,
}

/// Which library moves the data of new communicators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// hccn's own TCP runtime.
    #[default]
    Native,
    /// Huawei HCCL over ACL streams, loaded at run time (the `hccn-backend-hccl` crate).
    Hccl,
}

/// What `hccn_init_from_env` needs in addition to [`Config`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub local_world_size: u32,
    pub store: StoreAddr,
    pub job_id: String,
    pub job_token: Vec<u8>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_millis(30_000),
            bind_addr: IpAddr::from([127, 0, 0, 1]),
            chunk_bytes: 512 << 10,
            algo: AlgoChoice::Auto,
            heartbeat: Duration::from_millis(100),
            dead_after: Duration::from_millis(800),
            lease_ttl: Duration::from_secs(2),
            log: "warn".to_owned(),
            job_id: None,
            job_token: None,
            trace: None,
            backend: Backend::Native,
            hccl_lib: None,
            acl_lib: None,
            device_id: None,
            transport: Transport::Auto,
            cma: true,
        }
    }
}

fn parse<T: std::str::FromStr>(name: &str, value: &str, what: &str) -> Result<T> {
    value.trim().parse().map_err(|_| Error::invalid(format!("{name}={value:?} is not {what}")))
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads variables through `get` (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut c = Config::default();
        if let Some(v) = get("HCCN_TIMEOUT_MS") {
            let ms: u64 = parse("HCCN_TIMEOUT_MS", &v, "a number of milliseconds")?;
            if ms == 0 {
                return Err(Error::invalid("HCCN_TIMEOUT_MS must be at least 1"));
            }
            c.timeout = Duration::from_millis(ms);
        }
        if let Some(v) = get("HCCN_BIND_ADDR") {
            c.bind_addr = parse("HCCN_BIND_ADDR", &v, "an IP address")?;
        }
        if let Some(v) = get("HCCN_CHUNK_BYTES") {
            let b: usize = parse("HCCN_CHUNK_BYTES", &v, "a byte count")?;
            if !(MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(&b) {
                return Err(Error::invalid(format!(
                    "HCCN_CHUNK_BYTES={b} is outside {MIN_CHUNK_BYTES}..={MAX_CHUNK_BYTES}"
                )));
            }
            c.chunk_bytes = b;
        }
        if let Some(v) = get("HCCN_HEARTBEAT_MS") {
            c.heartbeat = Duration::from_millis(parse("HCCN_HEARTBEAT_MS", &v, "a number of milliseconds")?);
        }
        if let Some(v) = get("HCCN_DEAD_AFTER_MS") {
            c.dead_after = Duration::from_millis(parse("HCCN_DEAD_AFTER_MS", &v, "a number of milliseconds")?);
        }
        if let Some(v) = get("HCCN_LEASE_TTL_S") {
            let s: u64 = parse("HCCN_LEASE_TTL_S", &v, "a number of seconds")?;
            if !(1..=3600).contains(&s) {
                return Err(Error::invalid(format!("HCCN_LEASE_TTL_S={s} is outside 1..=3600")));
            }
            c.lease_ttl = Duration::from_secs(s);
        }
        if !c.heartbeat.is_zero() && c.dead_after < 2 * c.heartbeat {
            return Err(Error::invalid(format!(
                "HCCN_DEAD_AFTER_MS ({} ms) must be at least twice HCCN_HEARTBEAT_MS ({} ms)",
                c.dead_after.as_millis(),
                c.heartbeat.as_millis()
            )));
        }
        if let Some(v) = get("HCCN_TRANSPORT") {
            c.transport = match v.trim() {
                "auto" | "" => Transport::Auto,
                "tcp" => Transport::Tcp,
                "shm" => Transport::Shm,
                _ => return Err(Error::invalid(format!("HCCN_TRANSPORT={v:?} is not auto, tcp or shm"))),
            };
        }
        if let Some(v) = get("HCCN_CMA") {
            c.cma = match v.trim() {
                "auto" | "" => true,
                "off" => false,
                _ => return Err(Error::invalid(format!("HCCN_CMA={v:?} is not auto or off"))),
            };
        }
        if let Some(v) = get("HCCN_LOG") {
            c.log = v;
        }
        c.job_id = get("HCCN_JOB_ID").filter(|v| !v.is_empty());
        c.job_token = get("HCCN_JOB_TOKEN").filter(|v| !v.is_empty());
        if let Some(v) = get("HCCN_ALGO") {
            c.algo = AlgoChoice::from_name(&v).ok_or_else(|| {
                Error::invalid(format!("HCCN_ALGO={v:?} is not one of {}", AlgoChoice::names().join(", ")))
            })?;
        }
        c.trace = get("HCCN_TRACE").filter(|v| !v.is_empty()).map(std::path::PathBuf::from);
        c.backend = match get("HCCN_BACKEND").as_deref().map(str::trim) {
            None | Some("") | Some("native") => Backend::Native,
            Some("hccl") => Backend::Hccl,
            Some(other) => {
                return Err(Error::invalid(format!("HCCN_BACKEND={other:?} is not `native` or `hccl`")));
            }
        };
        let path = |name: &str| get(name).filter(|v| !v.is_empty()).map(std::path::PathBuf::from);
        c.hccl_lib = path("HCCN_HCCL_LIB");
        c.acl_lib = path("HCCN_ACL_LIB");
        c.device_id = match (get("HCCN_DEVICE_ID"), get("HCCN_LOCAL_RANK")) {
            (Some(v), _) => Some(parse("HCCN_DEVICE_ID", &v, "a device number")?),
            (None, Some(v)) => Some(parse("HCCN_LOCAL_RANK", &v, "a rank")?),
            (None, None) => None,
        };
        Ok(c)
    }
}

impl LaunchEnv {
    pub fn from_env() -> Result<Self> {
        LaunchEnv::from_lookup(|k| std::env::var(k).ok())
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let need = |name: &str| {
            get(name).ok_or_else(|| Error::invalid(format!("{name} is not set (run under hccnrun, or set it)")))
        };
        let rank: u32 = parse("HCCN_RANK", &need("HCCN_RANK")?, "a rank")?;
        let world_size: u32 = parse("HCCN_WORLD_SIZE", &need("HCCN_WORLD_SIZE")?, "a world size")?;
        if world_size == 0 || rank >= world_size {
            return Err(Error::invalid(format!("HCCN_RANK={rank} is not below HCCN_WORLD_SIZE={world_size}")));
        }
        let local_rank = match get("HCCN_LOCAL_RANK") {
            Some(v) => parse("HCCN_LOCAL_RANK", &v, "a rank")?,
            None => rank,
        };
        let local_world_size = match get("HCCN_LOCAL_WORLD_SIZE") {
            Some(v) => parse("HCCN_LOCAL_WORLD_SIZE", &v, "a size")?,
            None => world_size,
        };
        let store = StoreAddr::parse(&need("HCCN_STORE")?)?;
        let job_id = get("HCCN_JOB_ID").unwrap_or_else(|| "default".to_owned());
        let job_token = get("HCCN_JOB_TOKEN").unwrap_or_default().into_bytes();
        Ok(LaunchEnv { rank, world_size, local_rank, local_world_size, store, job_id, job_token })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn defaults_and_overrides() {
        assert_eq!(Config::from_lookup(lookup(&[])).ok(), Some(Config::default()));
        let c = Config::from_lookup(lookup(&[("HCCN_TIMEOUT_MS", "1500"), ("HCCN_CHUNK_BYTES", "65536")]));
        let c = c.expect("valid config");
        assert_eq!(c.timeout, Duration::from_millis(1500));
        assert_eq!(c.chunk_bytes, 65536);
    }

    #[test]
    fn algo_choice() {
        let e = Config::from_lookup(lookup(&[("HCCN_ALGO", "bubble")])).err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("HCCN_ALGO") && m.contains("rhd")), "names the choices");
        let c = Config::from_lookup(lookup(&[("HCCN_ALGO", "RHD")])).map(|c| c.algo).ok();
        assert_eq!(c, Some(AlgoChoice::Rhd));
    }

    #[test]
    fn bad_values_are_named() {
        let e = Config::from_lookup(lookup(&[("HCCN_TIMEOUT_MS", "soon")])).err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("HCCN_TIMEOUT_MS")));
        assert!(Config::from_lookup(lookup(&[("HCCN_CHUNK_BYTES", "1")])).is_err());
        let e = Config::from_lookup(lookup(&[("HCCN_BACKEND", "nccl")])).err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("HCCN_BACKEND")));
        let e = LaunchEnv::from_lookup(lookup(&[("HCCN_RANK", "3"), ("HCCN_WORLD_SIZE", "2")]));
        assert!(e.is_err());
    }

    #[test]
    fn transport_choice() {
        assert_eq!(Config::default().transport, Transport::Auto);
        for (v, t) in [("auto", Transport::Auto), ("tcp", Transport::Tcp), ("shm", Transport::Shm)] {
            assert_eq!(Config::from_lookup(lookup(&[("HCCN_TRANSPORT", v)])).map(|c| c.transport).ok(), Some(t));
        }
        let e = Config::from_lookup(lookup(&[("HCCN_TRANSPORT", "rdma")])).err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("HCCN_TRANSPORT")));
    }

    #[test]
    fn cma_choice() {
        assert!(Config::default().cma);
        assert_eq!(Config::from_lookup(lookup(&[("HCCN_CMA", "off")])).map(|c| c.cma).ok(), Some(false));
        assert_eq!(Config::from_lookup(lookup(&[("HCCN_CMA", "auto")])).map(|c| c.cma).ok(), Some(true));
        let e = Config::from_lookup(lookup(&[("HCCN_CMA", "on")])).err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("HCCN_CMA")));
    }

    #[test]
    fn launch_env() {
        let env = LaunchEnv::from_lookup(lookup(&[
            ("HCCN_RANK", "1"),
            ("HCCN_WORLD_SIZE", "4"),
            ("HCCN_STORE", "tcp://127.0.0.1:2000"),
            ("HCCN_JOB_TOKEN", "secret"),
        ]))
        .expect("valid env");
        assert_eq!((env.rank, env.world_size, env.local_rank), (1, 4, 1));
        assert_eq!(env.job_token, b"secret");
        assert_eq!(env.job_id, "default");
    }
}
