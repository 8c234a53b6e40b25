//! Every environment variable hccn reads, `HCCN_*` and the launchers' (launcher.rs), parsed in
//! one place. [`VARIABLES`] is the table the README reproduces (a test keeps the two in step).

use std::net::IpAddr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::rendezvous::EtcdAccess;
use crate::tuning::{AlgoChoice, LinkCost, LinkCosts, TransportKind, LINK_ALPHA_US, LINK_GBPS};

mod hostlist;
pub mod launcher;
mod ranktable;

pub use launcher::{LaunchEnv, Launcher, Meet};

/// One documented variable: name, default, meaning.
#[derive(Debug, Clone, Copy)]
pub struct Variable {
    pub name: &'static str,
    pub default: DefaultIs,
    pub meaning: &'static str,
}

/// A variable's default as the README shows it: read from [`Config::default`] where the default
/// is a value, so the number lives in one place; text where it is a rule ("set by hccnrun").
#[derive(Debug, Clone, Copy)]
pub enum DefaultIs {
    Text(&'static str),
    Value(fn(&Config) -> String),
}

impl Variable {
    /// The README's default cell.
    pub fn default_text(&self) -> String {
        match self.default {
            DefaultIs::Text(t) => t.to_owned(),
            DefaultIs::Value(f) => format!("`{}`", f(&Config::default())),
        }
    }
}

pub const VARIABLES: &[Variable] = &[
    Variable { name: "HCCN_RANK", default: DefaultIs::Text("(set by hccnrun)"), meaning: "This process's rank in the world communicator (`hccn_init_from_env`)." },
    Variable { name: "HCCN_WORLD_SIZE", default: DefaultIs::Text("(set by hccnrun)"), meaning: "Number of ranks in the world communicator." },
    Variable { name: "HCCN_LOCAL_RANK", default: DefaultIs::Text("`HCCN_RANK`"), meaning: "Rank among the processes on this host." },
    Variable { name: "HCCN_LOCAL_WORLD_SIZE", default: DefaultIs::Text("`HCCN_WORLD_SIZE`"), meaning: "Number of ranks on this host." },
    Variable { name: "HCCN_STORE", default: DefaultIs::Text("(set by hccnrun)"), meaning: "Rendezvous store, `tcp://host:port` (the embedded store hosted by hccnrun) or `etcd://host:port[,...]`. Under another launcher it overrides where the ranks would meet (docs/launchers.md)." },
    Variable { name: "HCCN_JOB_ID", default: DefaultIs::Text("`default`"), meaning: "Job name; namespaces the job's keys in the store, so ranks meet only ranks of the same job id (a rank that waits alone names the one it waited under)." },
    Variable { name: "HCCN_JOB_TOKEN", default: DefaultIs::Text("(from the job)"), meaning: "Shared secret for the HMAC-SHA256 challenge-response on every store and peer connection; hccnrun makes a fresh one per job, a PMIx job a fresh one through PMIx; under other launchers it is derived from the launcher's job id, which keeps jobs apart but is no secret: set it (the same on every rank) to keep other users of the hosts out." },
    Variable { name: "HCCN_TIMEOUT_MS", default: DefaultIs::Value(|c| c.timeout.as_millis().to_string()), meaning: "Deadline of every wait (connect, rendezvous, each receive); exceeded waits fail with `HCCN_ERROR_TIMEOUT`, naming the rank waited for. A small collective on one host that waits for a late rank warns once, naming it, after half of this (at most 10 s). Like `HCCL_EXEC_TIMEOUT`, in ms; at most 604800000 (7 days)." },
    Variable { name: "HCCN_BIND_ADDR", default: DefaultIs::Value(|c| c.bind_addr.to_string()), meaning: "Address that ranks and the embedded store listen on (never all interfaces unless asked). Under a launcher other than hccnrun, when unset, each rank listens on its own address towards the store, and rank 0's store on the address the launcher names (docs/launchers.md)." },
    Variable { name: "HCCN_CHUNK_BYTES", default: DefaultIs::Value(|c| c.chunk_bytes.to_string()), meaning: "Largest pipeline chunk of the algorithms (4 KiB .. 8 MiB); the cost model may choose smaller chunks per operation." },
    Variable { name: "HCCN_ALGO", default: DefaultIs::Value(|c| c.algo.name().to_owned()), meaning: "Algorithm of the collectives that have a choice (allreduce above all): `auto` (the cost model decides per operation), `ring`, `rhd` (recursive halving-doubling), `tree`, `hier`; see docs/algorithms.md. An algorithm that cannot run an allreduce on the communicator is an error." },
    Variable { name: "HCCN_LINK_COST", default: DefaultIs::Value(|c| c.link_cost.name().to_owned()), meaning: "Latency and bandwidth per transport for the cost model: `measure` (world rank 0 times a shared-memory and a TCP peer when the world forms, about 20 small and 3 1-MiB round trips each, and sends the figures to every rank), `default` (the built-in figures), or a list such as `shm=0.8us:9GB/s,tcp=40us:2.2GB/s` (kinds `shm`, `tcp`, `local`; units `us`/`ms` and `GB/s`/`MB/s`; unnamed kinds keep the built-in figures). World rank 0's setting is the one every rank uses; see docs/algorithms.md." },
    Variable { name: "HCCN_HEARTBEAT_MS", default: DefaultIs::Value(|c| c.heartbeat.as_millis().to_string()), meaning: "Interval of the heartbeat each rank sends to the peers it watches (see `HCCN_WATCHED_PEERS`); `0` turns heartbeats (and silence detection) off." },
    Variable { name: "HCCN_WATCHED_PEERS", default: DefaultIs::Value(|c| c.watched_peers.to_string()), meaning: "Peers a rank watches for silence on each side of it in the ring of live world ranks (heartbeats, pulses, `HCCN_DEAD_AFTER_MS`); a world of up to 2k+1 ranks watches every pair, a larger one keeps the heartbeat load per rank constant, and a silent rank's watchers tell every other rank at once. 1 to 64." },
    Variable { name: "HCCN_FULL_MESH_UP_TO", default: DefaultIs::Value(|c| c.full_mesh_up_to.to_string()), meaning: "Largest world that connects every pair of ranks as it forms. A larger one opens only the links its failure detection and news need (the `HCCN_WATCHED_PEERS` neighbours on each side, the hypercube partners rank xor 2^i); every other connection opens on its first message, from either side, with shared memory set up then for a pair on one host. `0` connects on demand at every size." },
    Variable { name: "HCCN_DEAD_AFTER_MS", default: DefaultIs::Value(|c| c.dead_after.as_millis().to_string()), meaning: "A peer silent this long (no frame, no heartbeat, nothing waiting in its socket) is declared failed: a frozen process or a cut link. Raise it where ranks may stall longer without being dead (dead versus slow)." },
    Variable { name: "HCCN_ETCD_CA", default: DefaultIs::Text("(plain gRPC)"), meaning: "With an `etcd://` store: PEM file of the CA that signed the etcd members' certificates. Setting it turns TLS on for every connection to etcd; the members' certificates must name the hosts (or IP addresses) of `HCCN_STORE`." },
    Variable { name: "HCCN_ETCD_CERT", default: DefaultIs::Text("(none)"), meaning: "With `HCCN_ETCD_CA`: PEM file of this process's client certificate, for an etcd started with `--client-cert-auth`. Goes with `HCCN_ETCD_KEY`." },
    Variable { name: "HCCN_ETCD_KEY", default: DefaultIs::Text("(none)"), meaning: "PEM file of the private key of `HCCN_ETCD_CERT`." },
    Variable { name: "HCCN_ETCD_USER", default: DefaultIs::Text("(none)"), meaning: "etcd user to log in as, for an etcd with authentication enabled (`etcdctl auth enable`); it needs read and write access to the keys under `/hccn/`. Goes with `HCCN_ETCD_PASSWORD`." },
    Variable { name: "HCCN_ETCD_PASSWORD", default: DefaultIs::Text("(none)"), meaning: "Password of `HCCN_ETCD_USER` (never logged)." },
    Variable { name: "HCCN_LEASE_TTL_S", default: DefaultIs::Value(|c| c.lease_ttl.as_secs().to_string()), meaning: "With an etcd store, each world communicator's membership key lives on a lease of this many seconds, kept alive in the background: a backstop that declares a rank failed when its process dies or freezes, even with heartbeats off (1 .. 3600; etcd may round it up)." },
    Variable { name: "HCCN_TRACE", default: DefaultIs::Text("(off)"), meaning: "Directory where each rank writes a Chrome trace-event file `hccn-trace-<job>-<rank>.json` (one event per operation and per transfer); see docs/observability.md." },
    Variable { name: "HCCN_TRANSPORT", default: DefaultIs::Value(|c| c.transport.name().to_owned()), meaning: "Data transport between ranks: `auto` (shared memory between ranks on one host, TCP between hosts), `tcp` (TCP everywhere), `shm` (shared memory, and an error if a peer is on another host). TCP always stays for control and failure detection." },
    Variable { name: "HCCN_BOARD_BYTES", default: DefaultIs::Value(|c| c.board_bytes.to_string()), meaning: "Largest post (in bytes) of a collective that a communicator whose ranks all share one host runs on its shared-memory board: one round in which each rank posts what it contributes (an allreduce its buffer, an allgather its block, an alltoall its whole input) and reads what it needs of everyone's (see docs/algorithms.md); `0` sends every collective as messages. At most 4096." },
    Variable { name: "HCCN_CMA", default: DefaultIs::Value(|c| c.cma.name().to_owned()), meaning: "Single-copy reads of large shared-memory messages with `process_vm_readv` (cross-memory attach): `auto` (used between two ranks when a probe at connection shows the kernel permits it and a read costs this host at most two copies, measured once per process; where the host's ranks outnumber its cores, only for buffers from `hccn_mem_alloc`, which are read with plain loads whatever a read costs), `on` (wherever the kernel permits, whatever a read costs) or `off` (every byte goes through the shared-memory rings)." },
    Variable { name: "HCCN_LOG", default: DefaultIs::Value(|c| c.log.clone()), meaning: "Log filter: a level (`off`, `error`, `warn`, `info`, `debug`, `trace`) or a comma-separated list of levels and `target=level` items (tracing's syntax); any other value is refused. Logs go to stderr." },
    Variable { name: "HCCN_BACKEND", default: DefaultIs::Value(|c| c.backend.name().to_owned()), meaning: "Data path of new communicators: `native` (hccn's TCP runtime) or `hccl` (Huawei HCCL on Ascend NPUs, loaded at run time; see docs/hccl.md)." },
    Variable { name: "HCCN_HCCL_LIB", default: DefaultIs::Text("(search)"), meaning: "Path of `libhccl.so` for `HCCN_BACKEND=hccl`; else `$ASCEND_HOME_PATH/lib64`, `$ASCEND_TOOLKIT_HOME/lib64`, then the loader's search path." },
    Variable { name: "HCCN_ACL_LIB", default: DefaultIs::Text("(search)"), meaning: "Path of `libascendcl.so` for `HCCN_BACKEND=hccl`; searched like `HCCN_HCCL_LIB`." },
    Variable { name: "HCCN_DEVICE_ID", default: DefaultIs::Text("`HCCN_LOCAL_RANK`"), meaning: "NPU that this process binds with `aclrtSetDevice` (`HCCN_BACKEND=hccl`); else the rank table's `device_id`, else the local rank, else 0." },
    Variable { name: "HCCN_PMIX", default: DefaultIs::Text("`auto`"), meaning: "`auto`: where the launcher runs a PMIx server (`PMIX_RANK` and `PMIX_NAMESPACE` set: Open MPI, `srun --mpi=pmix` on several nodes), rank 0 tells the others its store's address through PMIx; `off`: never (Open MPI on one host then meets on a port derived from its job id)." },
    Variable { name: "HCCN_PMIX_LIB", default: DefaultIs::Text("(search)"), meaning: "Path of `libpmix.so.2`, loaded at run time for `HCCN_PMIX`; else the loader's search path." },
    Variable { name: "RANK", default: DefaultIs::Text("(set by torchrun)"), meaning: "torchrun, Kubeflow and JobSet: this process's rank; with `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` rank 0 hosts the store at `MASTER_ADDR`, port `MASTER_PORT`+53 (docs/launchers.md)." },
    Variable { name: "WORLD_SIZE", default: DefaultIs::Text("(set by torchrun)"), meaning: "torchrun: the number of ranks." },
    Variable { name: "LOCAL_RANK", default: DefaultIs::Text("`RANK`"), meaning: "torchrun: rank on this host." },
    Variable { name: "LOCAL_WORLD_SIZE", default: DefaultIs::Text("`WORLD_SIZE`"), meaning: "torchrun: ranks on this host; with `LOCAL_RANK`, a world that spans hosts is refused a loopback `MASTER_ADDR`." },
    Variable { name: "GROUP_RANK", default: DefaultIs::Text("(set by torchrun)"), meaning: "torchrun: index of this host's agent (hccn-info's node)." },
    Variable { name: "MASTER_ADDR", default: DefaultIs::Text("(set by torchrun)"), meaning: "torchrun: host of rank 0, where hccn's store listens too." },
    Variable { name: "MASTER_PORT", default: DefaultIs::Text("(set by torchrun)"), meaning: "torchrun: torch's store port; hccn's is 53 above (53 below past 65535)." },
    Variable { name: "TORCHELASTIC_RUN_ID", default: DefaultIs::Text("(set by torchrun)"), meaning: "torchrun: the run's id; its presence says torchrun started this process (an enclosing Slurm step's other numbers are then nesting, not a conflict)." },
    Variable { name: "SLURM_JOB_ID", default: DefaultIs::Text("(set by Slurm)"), meaning: "Slurm: the job; with `SLURM_STEP_ID`, names the store's port: 20000 + (a hash of job and step) mod 10000." },
    Variable { name: "SLURM_STEP_ID", default: DefaultIs::Text("(set by srun)"), meaning: "Slurm: the job step; absent in a batch script or an salloc shell, whose Slurm variables describe no ranks (an error when no other launcher is found)." },
    Variable { name: "SLURM_PROCID", default: DefaultIs::Text("(set by srun)"), meaning: "Slurm: this task's rank in the step." },
    Variable { name: "SLURM_NTASKS", default: DefaultIs::Text("(set by srun)"), meaning: "Slurm: the step's number of tasks." },
    Variable { name: "SLURM_LOCALID", default: DefaultIs::Text("(set by srun)"), meaning: "Slurm: rank on this node." },
    Variable { name: "SLURM_NODEID", default: DefaultIs::Text("(set by srun)"), meaning: "Slurm: index of this node in the step." },
    Variable { name: "SLURM_STEP_NODELIST", default: DefaultIs::Text("(set by srun)"), meaning: "Slurm: the step's nodes, compressed (`node[01-04,07]`); rank 0 hosts the store on the first (on loopback when the step has one node)." },
    Variable { name: "SLURM_STEP_TASKS_PER_NODE", default: DefaultIs::Text("(set by srun)"), meaning: "Slurm: tasks per node (`2(x3),1`), for the local world size." },
    Variable { name: "OMPI_COMM_WORLD_RANK", default: DefaultIs::Text("(set by mpirun)"), meaning: "Open MPI: this process's rank." },
    Variable { name: "OMPI_COMM_WORLD_SIZE", default: DefaultIs::Text("(set by mpirun)"), meaning: "Open MPI: the number of ranks." },
    Variable { name: "OMPI_COMM_WORLD_LOCAL_RANK", default: DefaultIs::Text("(set by mpirun)"), meaning: "Open MPI: rank on this host." },
    Variable { name: "OMPI_COMM_WORLD_LOCAL_SIZE", default: DefaultIs::Text("(set by mpirun)"), meaning: "Open MPI: ranks on this host (all of them: the job is on one host)." },
    Variable { name: "OMPI_MCA_ess_base_jobid", default: DefaultIs::Text("(set by mpirun)"), meaning: "Open MPI 4: the job id, where `PMIX_NAMESPACE` is not set." },
    Variable { name: "PMIX_RANK", default: DefaultIs::Text("(set by the launcher)"), meaning: "A PMIx server serves this process (Open MPI, `srun --mpi=pmix`): see `HCCN_PMIX`." },
    Variable { name: "PMIX_NAMESPACE", default: DefaultIs::Text("(set by the launcher)"), meaning: "PMIx: the job's namespace; also the job id from which Open MPI's port on one host is derived." },
    Variable { name: "PMI_RANK", default: DefaultIs::Text("(set by the launcher)"), meaning: "MPICH's Hydra, Intel MPI, Cray PALS, `srun --mpi=pmi2`: this process's rank." },
    Variable { name: "PMI_SIZE", default: DefaultIs::Text("(set by the launcher)"), meaning: "PMI: the number of ranks." },
    Variable { name: "PMI_LOCAL_RANK", default: DefaultIs::Text("(set by the launcher)"), meaning: "PMI (Cray PALS): rank on this host." },
    Variable { name: "PMI_LOCAL_SIZE", default: DefaultIs::Text("(set by the launcher)"), meaning: "PMI (Cray PALS): ranks on this host." },
    Variable { name: "MPI_LOCALRANKID", default: DefaultIs::Text("(set by the launcher)"), meaning: "MPICH's Hydra: rank on this host." },
    Variable { name: "MPI_LOCALNRANKS", default: DefaultIs::Text("(set by the launcher)"), meaning: "MPICH's Hydra: ranks on this host." },
    Variable { name: "PMI_JOBID", default: DefaultIs::Text("(the launcher's process id)"), meaning: "PMI: the job id from which the port on one host is derived; Hydra sets none, and its ranks on a host share the proxy as parent process." },
    Variable { name: "MS_ROLE", default: DefaultIs::Text("(set by msrun)"), meaning: "MindSpore msrun: `MS_WORKER` for a rank; msrun's scheduler process (`MS_SCHED`) is no rank (`hccn_ms` ends it at import: hccn forms the world)." },
    Variable { name: "MS_WORKER_NUM", default: DefaultIs::Text("(set by msrun)"), meaning: "msrun: the number of ranks." },
    Variable { name: "MS_NODE_ID", default: DefaultIs::Text("`RANK_ID`"), meaning: "msrun: this worker's rank (msrun on several nodes sets it only with `--node_rank`)." },
    Variable { name: "MS_SCHED_HOST", default: DefaultIs::Text("(set by msrun)"), meaning: "msrun: the scheduler's host, where rank 0 hosts hccn's store." },
    Variable { name: "MS_SCHED_PORT", default: DefaultIs::Text("(set by msrun)"), meaning: "msrun: the scheduler's port; hccn's store is 53 above." },
    Variable { name: "RANK_ID", default: DefaultIs::Text("(set by hand or msrun)"), meaning: "The Ascend rank table's (and msrun's) rank of this process." },
    Variable { name: "RANK_TABLE_FILE", default: DefaultIs::Text("(none)"), meaning: "The Ascend rank table (JSON, version 1.0 or 1.2): world size, each rank's server and `device_id` (the NPU of `HCCN_BACKEND=hccl`); rank 0 hosts the store on its server (loopback for a one-server table), port 20000 + (a hash of the table) mod 10000." },
    Variable { name: "MINDSPORE_HCCL_CONFIG_PATH", default: DefaultIs::Text("(none)"), meaning: "MindSpore's older name of `RANK_TABLE_FILE`." },
    Variable { name: "HCCN_LIB", default: DefaultIs::Text("(in the package)"), meaning: "Path of a `libhccn.so` for the Python package `hccn` to load instead of its own `hccn/lib/libhccn.so.1` (read by bindings/python only)." },
];

/// Largest frame payload a peer may send; any larger header closes the connection.
pub const MAX_CHUNK_BYTES: usize = 8 << 20;
/// Largest HCCN_TIMEOUT_MS: 7 days (the bindings clamp frameworks' longer timeouts to it).
pub const MAX_TIMEOUT_MS: u64 = 7 * 24 * 3600 * 1000;
const MIN_CHUNK_BYTES: usize = 4 << 10;

/// Whether large shared-memory messages may be read once, across processes (`HCCN_CMA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cma {
    /// Where the kernel permits it, and where such a read costs this host no more than the
    /// copies through the rings it saves (measured once per process); buffers from
    /// `hccn_mem_alloc`, read with plain loads, wherever the kernel permits.
    #[default]
    Auto,
    /// Wherever the kernel permits it, whatever it costs.
    On,
    Off,
}

impl Cma {
    pub fn name(self) -> &'static str {
        match self {
            Cma::Auto => "auto",
            Cma::On => "on",
            Cma::Off => "off",
        }
    }
}

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

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::Tcp => "tcp",
            Transport::Shm => "shm",
        }
    }
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
    /// `HCCN_WATCHED_PEERS`: peers watched for silence on each side in the ring of live ranks.
    pub watched_peers: usize,
    /// `HCCN_FULL_MESH_UP_TO`: worlds larger than this connect on demand.
    pub full_mesh_up_to: u32,
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
    pub backend: BackendKind,
    /// `HCCN_HCCL_LIB` / `HCCN_ACL_LIB`: explicit library paths for the HCCL backend.
    pub hccl_lib: Option<std::path::PathBuf>,
    pub acl_lib: Option<std::path::PathBuf>,
    /// `HCCN_DEVICE_ID`, else `HCCN_LOCAL_RANK`: the NPU of this process on the HCCL backend.
    pub device_id: Option<i32>,
    /// `HCCN_TRANSPORT`.
    pub transport: Transport,
    /// `HCCN_LINK_COST`: where the cost model's link figures come from.
    pub link_cost: LinkCostSource,
    /// `HCCN_CMA`: may large shared-memory messages be read once, across processes?
    pub cma: Cma,
    /// `HCCN_BOARD_BYTES`: the largest post of a collective that goes to the shared-memory board.
    pub board_bytes: usize,
    /// `HCCN_ETCD_*`: TLS and login for `etcd://` stores.
    pub etcd: EtcdAccess,
}

/// Where the link figures of the cost model come from (`HCCN_LINK_COST`); world rank 0's
/// setting decides for the whole world.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum LinkCostSource {
    /// Timed by world rank 0 when a world forms.
    #[default]
    Measure,
    /// The built-in figures ([`LinkCosts::builtin`]).
    Builtin,
    /// Given in the variable (the built-in figures for kinds it does not name).
    Explicit(LinkCosts),
}

// The parser accepts only finite figures within LINK_ALPHA_US and LINK_GBPS: never NaN.
impl Eq for LinkCostSource {}

impl LinkCostSource {
    /// The variable's keyword for this source (`explicit` for a list).
    pub fn name(&self) -> &'static str {
        match self {
            LinkCostSource::Measure => "measure",
            LinkCostSource::Builtin => "default",
            LinkCostSource::Explicit(_) => "explicit",
        }
    }

    /// Parses `measure`, `default`, or `kind=LATENCY:BANDWIDTH,...`.
    pub fn parse(value: &str) -> Result<Self> {
        let v = value.trim();
        match v.to_ascii_lowercase().as_str() {
            "" | "measure" => return Ok(LinkCostSource::Measure),
            "default" => return Ok(LinkCostSource::Builtin),
            _ => {}
        }
        let mut costs = LinkCosts::builtin();
        let mut named: Vec<TransportKind> = Vec::new();
        for item in v.split(',') {
            let (kind, cost) = parse_link(item.trim())
                .map_err(|why| Error::invalid(format!("HCCN_LINK_COST={value:?}: {why} in {:?}", item.trim())))?;
            if named.contains(&kind) {
                return Err(Error::invalid(format!("HCCN_LINK_COST={value:?}: {} is given twice", kind.name())));
            }
            named.push(kind);
            costs.set(kind, cost);
        }
        Ok(LinkCostSource::Explicit(costs))
    }
}

const LINK_COST_FORM: &str = "expected `measure`, `default` or KIND=LATENCY:BANDWIDTH (KIND shm, tcp or local, \
     LATENCY in us or ms, BANDWIDTH in GB/s or MB/s, e.g. shm=0.8us:9GB/s), comma-separated";

/// One `kind=latency:bandwidth` item.
fn parse_link(item: &str) -> std::result::Result<(TransportKind, LinkCost), String> {
    let (kind, figures) = item.split_once('=').ok_or(LINK_COST_FORM)?;
    let kind = TransportKind::ALL
        .into_iter()
        .find(|k| k.name() == kind.trim().to_ascii_lowercase())
        .ok_or_else(|| format!("unknown transport {:?} (shm, tcp or local)", kind.trim()))?;
    let (latency, bandwidth) = figures.split_once(':').ok_or(LINK_COST_FORM)?;
    let alpha_us = with_unit(latency, &[("us", 1.0), ("µs", 1.0), ("ms", 1000.0)], "a latency in us or ms")?;
    let gbps = with_unit(bandwidth, &[("gb/s", 1.0), ("mb/s", 1e-3)], "a bandwidth in GB/s or MB/s")?;
    if !LINK_ALPHA_US.contains(&alpha_us) {
        return Err(format!("latency {alpha_us} us is outside {}..={} us", LINK_ALPHA_US.start(), LINK_ALPHA_US.end()));
    }
    if !LINK_GBPS.contains(&gbps) {
        return Err(format!("bandwidth {gbps} GB/s is outside {}..={} GB/s", LINK_GBPS.start(), LINK_GBPS.end()));
    }
    Ok((kind, LinkCost::new(alpha_us, gbps)))
}

/// A number followed by one of `units` (case-insensitive), scaled by the unit's factor.
fn with_unit(text: &str, units: &[(&str, f64)], what: &str) -> std::result::Result<f64, String> {
    let t = text.trim().to_lowercase();
    let (number, factor) = units
        .iter()
        .find_map(|(u, f)| t.strip_suffix(u).map(|n| (n.trim(), *f)))
        .ok_or_else(|| format!("{:?} is not {what}", text.trim()))?;
    let x: f64 = number.parse().map_err(|_| format!("{:?} is not {what}", text.trim()))?;
    if !x.is_finite() {
        return Err(format!("{:?} is not {what}", text.trim()));
    }
    Ok(x * factor)
}

/// Which library moves the data of new communicators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// hccn's own TCP runtime.
    #[default]
    Native,
    /// Huawei HCCL over ACL streams, loaded at run time (the `hccn-backend-hccl` crate).
    Hccl,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Native => "native",
            BackendKind::Hccl => "hccl",
        }
    }
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
            watched_peers: 3,
            full_mesh_up_to: 16,
            lease_ttl: Duration::from_secs(2),
            log: "warn".to_owned(),
            job_id: None,
            job_token: None,
            trace: None,
            backend: BackendKind::Native,
            hccl_lib: None,
            acl_lib: None,
            device_id: None,
            transport: Transport::Auto,
            link_cost: LinkCostSource::Measure,
            cma: Cma::Auto,
            board_bytes: crate::tuning::BOARD_BYTES,
            etcd: EtcdAccess::default(),
        }
    }
}

fn parse<T: std::str::FromStr>(name: &str, value: &str, what: &str) -> Result<T> {
    value.trim().parse().map_err(|_| Error::invalid(format!("{name}={value:?} is not {what}")))
}

const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// `HCCN_LOG`: comma-separated `LEVEL` or `target=LEVEL` items (a subset of tracing's filter
/// syntax). Anything else is refused: tracing itself would take a misspelt level such as
/// `bogus` for a target name and quietly log nothing.
fn log_filter(value: &str) -> Result<String> {
    let v = value.trim();
    if v.is_empty() {
        return Ok("warn".to_owned());
    }
    let is_level = |l: &str| LOG_LEVELS.contains(&l.trim().to_ascii_lowercase().as_str());
    let is_target = |t: &str| {
        let t = t.trim();
        !t.is_empty() && t.chars().all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '_' | '-' | ':'))
    };
    for item in v.split(',') {
        let ok = match item.split_once('=') {
            Some((target, level)) => is_target(target) && is_level(level),
            None => is_level(item),
        };
        if !ok {
            return Err(Error::invalid(format!(
                "HCCN_LOG={value:?}: {:?} is not a level ({}) or target=level",
                item.trim(),
                LOG_LEVELS.join(", ")
            )));
        }
    }
    Ok(v.to_owned())
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
            if ms > MAX_TIMEOUT_MS {
                return Err(Error::invalid(format!(
                    "HCCN_TIMEOUT_MS={ms} is more than {MAX_TIMEOUT_MS} (7 days): a deadline that never comes \
                     makes a dead peer hang the job"
                )));
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
        if let Some(v) = get("HCCN_WATCHED_PEERS") {
            let k: usize = parse("HCCN_WATCHED_PEERS", &v, "a number of peers")?;
            if !(1..=64).contains(&k) {
                return Err(Error::invalid(format!("HCCN_WATCHED_PEERS={k} is outside 1..=64")));
            }
            c.watched_peers = k;
        }
        if let Some(v) = get("HCCN_FULL_MESH_UP_TO") {
            c.full_mesh_up_to = parse("HCCN_FULL_MESH_UP_TO", &v, "a number of ranks")?;
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
        if let Some(v) = get("HCCN_LINK_COST") {
            c.link_cost = LinkCostSource::parse(&v)?;
        }
        if let Some(v) = get("HCCN_BOARD_BYTES") {
            let b: usize = parse("HCCN_BOARD_BYTES", &v, "a byte count")?;
            let max = crate::tuning::BOARD_BYTES;
            if b > max {
                return Err(Error::invalid(format!("HCCN_BOARD_BYTES={b} is above {max}")));
            }
            c.board_bytes = b;
        }
        if let Some(v) = get("HCCN_CMA") {
            c.cma = match v.trim() {
                "auto" | "" => Cma::Auto,
                "on" => Cma::On,
                "off" => Cma::Off,
                _ => return Err(Error::invalid(format!("HCCN_CMA={v:?} is not auto, on or off"))),
            };
        }
        if let Some(v) = get("HCCN_LOG") {
            c.log = log_filter(&v)?;
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
            None | Some("") | Some("native") => BackendKind::Native,
            Some("hccl") => BackendKind::Hccl,
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
        c.etcd = etcd_access(&get)?;
        Ok(c)
    }
}

/// `HCCN_ETCD_*`: the settings that go together are checked here, the files when etcd is dialled.
fn etcd_access(get: &impl Fn(&str) -> Option<String>) -> Result<EtcdAccess> {
    let set = |name: &str| get(name).filter(|v| !v.trim().is_empty());
    let path = |name: &str| set(name).map(std::path::PathBuf::from);
    let access = EtcdAccess {
        ca: path("HCCN_ETCD_CA"),
        cert: path("HCCN_ETCD_CERT"),
        key: path("HCCN_ETCD_KEY"),
        user: set("HCCN_ETCD_USER"),
        password: get("HCCN_ETCD_PASSWORD").filter(|v| !v.is_empty()),
    };
    if access.cert.is_some() != access.key.is_some() {
        return Err(Error::invalid("HCCN_ETCD_CERT and HCCN_ETCD_KEY go together: set both or neither"));
    }
    if access.cert.is_some() && access.ca.is_none() {
        return Err(Error::invalid(
            "HCCN_ETCD_CERT needs HCCN_ETCD_CA (the CA that signed the etcd members' certificates): \
             client certificates are only sent over TLS",
        ));
    }
    if access.user.is_some() != access.password.is_some() {
        return Err(Error::invalid("HCCN_ETCD_USER and HCCN_ETCD_PASSWORD go together: set both or neither"));
    }
    Ok(access)
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
        // A deadline of u64::MAX ms would never come: refused, naming the bound.
        let e =
            Config::from_lookup(lookup(&[("HCCN_TIMEOUT_MS", "18446744073709551615")])).err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("7 days")));
        let week = MAX_TIMEOUT_MS.to_string();
        assert!(Config::from_lookup(lookup(&[("HCCN_TIMEOUT_MS", week.as_str())])).is_ok());
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

    fn link_cost(v: &str) -> std::result::Result<LinkCostSource, String> {
        Config::from_lookup(lookup(&[("HCCN_LINK_COST", v)])).map(|c| c.link_cost).map_err(|e| e.to_string())
    }

    #[test]
    fn link_cost_modes_and_lists() {
        assert_eq!(Config::default().link_cost, LinkCostSource::Measure);
        assert_eq!(link_cost("measure"), Ok(LinkCostSource::Measure));
        assert_eq!(link_cost(" Default "), Ok(LinkCostSource::Builtin));
        let Ok(LinkCostSource::Explicit(c)) = link_cost("shm=0.8us:9GB/s, tcp=40us:2.2GB/s") else {
            panic!("a valid list: {:?}", link_cost("shm=0.8us:9GB/s, tcp=40us:2.2GB/s"))
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9 * b.abs().max(1.0);
        assert!(close(c.shm.alpha_us(), 0.8) && close(c.shm.gbps(), 9.0), "{c}");
        assert!(close(c.tcp.alpha_us(), 40.0) && close(c.tcp.gbps(), 2.2), "{c}");
        assert_eq!(c.local, LinkCosts::builtin().local, "unnamed kinds keep the built-in figures");
        // Units: ms and MB/s, any case, spaces around numbers.
        let Ok(LinkCostSource::Explicit(c)) = link_cost("TCP = 2 ms : 500 MB/s") else { panic!("units") };
        assert!(close(c.tcp.alpha_us(), 2000.0) && close(c.tcp.gbps(), 0.5), "{c}");
        assert_eq!(c.shm, LinkCosts::builtin().shm);
        // What Display prints parses back to the same figures.
        let Ok(LinkCostSource::Explicit(back)) = link_cost(&c.to_string()) else { panic!("round trip of {c}") };
        assert!(close(back.tcp.alpha_us(), 2000.0) && close(back.local.gbps(), c.local.gbps()), "{back}");
    }

    #[test]
    fn link_cost_garbage_is_refused_with_the_reason() {
        for (v, needle) in [
            ("fast", "expected `measure`"),
            ("shm", "expected `measure`"),
            ("shm=1us", "expected `measure`"),
            ("rdma=1us:1GB/s", "unknown transport \"rdma\""),
            ("shm=1:1GB/s", "not a latency"),
            ("shm=1s:1GB/s", "not a latency"),
            ("shm=xus:1GB/s", "not a latency"),
            ("shm=NaNus:1GB/s", "not a latency"),
            ("shm=1us:1Gb", "not a bandwidth"),
            ("shm=1us:infGB/s", "not a bandwidth"),
            ("shm=0us:1GB/s", "outside"),
            ("shm=-1us:1GB/s", "outside"),
            ("tcp=1us:1000GB/s", "outside"),
            ("tcp=20ms:1GB/s", "outside"),
            ("shm=1us:1GB/s,", "expected `measure`"),
            ("shm=1us:1GB/s,shm=2us:1GB/s", "given twice"),
        ] {
            let e = link_cost(v).err().unwrap_or_else(|| panic!("{v:?} was accepted"));
            assert!(e.contains("HCCN_LINK_COST") && e.contains(needle), "{v:?}: {e}");
        }
    }

    #[test]
    fn log_filters_accept_levels_and_target_lists_only() {
        let log = |v: &str| Config::from_lookup(lookup(&[("HCCN_LOG", v)])).map(|c| c.log).map_err(|e| e.to_string());
        for ok in ["warn", "DEBUG", "off", " info ", "hccn_runtime=debug", "warn,hccn_runtime::transport=trace"] {
            assert_eq!(log(ok), Ok(ok.trim().to_owned()), "{ok:?}");
        }
        assert_eq!(log(""), Ok("warn".to_owned()));
        for bad in ["bogus", "verbose", "hccn_runtime", "hccn=loud", "=debug", "warn,", "a b=info", "x[span]=debug"] {
            let e = log(bad).err().unwrap_or_else(|| panic!("HCCN_LOG={bad:?} was accepted"));
            assert!(e.contains("HCCN_LOG") && e.contains("error, warn, info"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn cma_choice() {
        assert_eq!(Config::default().cma, Cma::Auto);
        assert_eq!(Config::from_lookup(lookup(&[("HCCN_CMA", "off")])).map(|c| c.cma).ok(), Some(Cma::Off));
        assert_eq!(Config::from_lookup(lookup(&[("HCCN_CMA", "auto")])).map(|c| c.cma).ok(), Some(Cma::Auto));
        assert_eq!(Config::from_lookup(lookup(&[("HCCN_CMA", "on")])).map(|c| c.cma).ok(), Some(Cma::On));
        let e = Config::from_lookup(lookup(&[("HCCN_CMA", "always")])).err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("HCCN_CMA")));
    }

    #[test]
    fn etcd_access_settings() {
        let c = Config::from_lookup(lookup(&[
            ("HCCN_ETCD_CA", "/ca.pem"),
            ("HCCN_ETCD_CERT", "/c.pem"),
            ("HCCN_ETCD_KEY", "/k.pem"),
            ("HCCN_ETCD_USER", "hccn"),
            ("HCCN_ETCD_PASSWORD", "s3cret"),
        ]))
        .expect("a full set");
        assert_eq!(c.etcd.ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert_eq!((c.etcd.user.as_deref(), c.etcd.password.as_deref()), (Some("hccn"), Some("s3cret")));
        assert!(!format!("{c:?}").contains("s3cret"), "the password stays out of Debug output");
        for (pairs, needle) in [
            (&[("HCCN_ETCD_CA", "/ca"), ("HCCN_ETCD_CERT", "/c")][..], "HCCN_ETCD_KEY"),
            (&[("HCCN_ETCD_CERT", "/c"), ("HCCN_ETCD_KEY", "/k")][..], "HCCN_ETCD_CA"),
            (&[("HCCN_ETCD_USER", "u")][..], "HCCN_ETCD_PASSWORD"),
            (&[("HCCN_ETCD_PASSWORD", "p")][..], "HCCN_ETCD_USER"),
        ] {
            let e = Config::from_lookup(lookup(pairs)).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(needle), "{pairs:?}: {e}");
        }
        // The launch environment carries them to the etcd address.
        let env = LaunchEnv::from_lookup(lookup(&[
            ("HCCN_RANK", "0"),
            ("HCCN_WORLD_SIZE", "1"),
            ("HCCN_STORE", "etcd://127.0.0.1:2379"),
            ("HCCN_ETCD_USER", "u"),
            ("HCCN_ETCD_PASSWORD", "p"),
        ]))
        .expect("valid env");
        let Meet::Store(crate::rendezvous::StoreAddr::Etcd(cluster)) = env.meet else { panic!("an etcd store") };
        assert_eq!(cluster.access.user.as_deref(), Some("u"));
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
