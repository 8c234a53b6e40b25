//! Which launcher started this process and where its ranks meet: the one detection step of
//! `hccn_init_from_env` (and so of every binding's init). docs/launchers.md tells it for users.
//!
//! Each launcher's variables make a claim (rank, size, where to meet). `HCCN_*` (hccnrun, or the
//! user) wins outright. Otherwise the claims are tried innermost first: torchrun, msrun, MPI,
//! Slurm, the rank table. Launchers nest (torchrun or mpirun inside a Slurm step, whose tasks
//! are the agents or daemons that start the ranks), and a process inherits the variables of
//! every launcher above it, so the innermost one is the one that started it. An outer claim
//! must describe a world no larger than the chosen one, with the same rank when it is as large
//! (the same processes seen twice); anything else is a conflict, refused with both claims named.
//! Variables of a launcher that describe no processes (Slurm's in a batch script) or lack a part
//! are an error only when no other launcher claims this process.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use super::hostlist::{expand_counts, expand_hosts};
use super::ranktable::{fnv1a, RankTable};
use super::{etcd_access, parse};
use crate::error::{Error, Result};
use crate::rendezvous::StoreAddr;

/// What started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// `HCCN_RANK`, `HCCN_WORLD_SIZE`, `HCCN_STORE`: hccnrun, or set by hand.
    Hccn,
    /// `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`: torchrun, Kubeflow, JobSet.
    Torchrun,
    Msrun,
    OpenMpi,
    /// `PMI_RANK`, `PMI_SIZE`: MPICH's Hydra, Intel MPI, Cray PALS.
    Pmi,
    Slurm,
    RankTable,
}

impl Launcher {
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Hccn => "hccnrun (HCCN_*)",
            Launcher::Torchrun => "torchrun (or its variables: Kubeflow, JobSet)",
            Launcher::Msrun => "MindSpore msrun",
            Launcher::OpenMpi => "Open MPI mpirun",
            Launcher::Pmi => "MPICH/Hydra (PMI_*)",
            Launcher::Slurm => "Slurm srun",
            Launcher::RankTable => "Ascend rank table",
        }
    }
}

/// Where the ranks of a world meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Meet {
    /// A store someone else runs: `HCCN_STORE` (hccnrun's, an etcd cluster, ...).
    Store(StoreAddr),
    /// Rank 0 starts the embedded store, listening on `listen`; everyone dials `dial`.
    Rank0 { dial: SocketAddr, listen: SocketAddr },
    /// Rank 0 starts the embedded store on a free port and tells the others through PMIx (put,
    /// fence, get). `single_node`: every rank is on one host (rank 0 listens on loopback);
    /// `fallback`: where to meet when libpmix cannot be loaded.
    Pmix { single_node: bool, fallback: Option<Box<Meet>> },
}

/// What `hccn_init_from_env` needs in addition to [`super::Config`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    pub launcher: Launcher,
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub local_world_size: u32,
    /// Index of this process's host among the job's, where the launcher says.
    pub node: Option<u32>,
    pub meet: Meet,
    /// Why the ranks meet there, in the user's words (hccn-info prints it).
    pub why: String,
    pub job_id: String,
    pub job_token: Vec<u8>,
    /// `HCCN_JOB_TOKEN` set the token; otherwise it is derived from the launcher's job, which
    /// separates jobs but is no secret (and a PMIx job makes a secret one).
    pub token_given: bool,
    /// `HCCN_BIND_ADDR` is set; otherwise each rank listens on its address towards the store.
    pub bind_given: bool,
    /// The NPU the launcher gives this rank (the rank table's `device_id`).
    pub device_id: Option<i32>,
    /// `HCCN_PMIX_LIB`.
    pub pmix_lib: Option<PathBuf>,
    /// Other launchers' variables seen and how they fit (hccn-info prints them).
    pub also: Vec<String>,
}

/// Added to `MASTER_PORT` (torchrun binds it itself) and `MS_SCHED_PORT` (msrun's scheduler
/// does) for rank 0's store; subtracted where the sum would pass 65535.
pub const PORT_OFFSET: u16 = 53;
/// Ports derived from a job's id (Slurm, Open MPI on one host, the rank table) fall in
/// `DERIVED_PORTS.0 .. DERIVED_PORTS.0 + DERIVED_PORTS.1`, below Linux's ephemeral range.
pub const DERIVED_PORTS: (u16, u16) = (20000, 10000);

/// A port in the derived range for the job named `id`.
pub fn derived_port(id: &str) -> u16 {
    DERIVED_PORTS.0 + (fnv1a(id.as_bytes()) % u64::from(DERIVED_PORTS.1)) as u16
}

fn offset_port(port: u16) -> u16 {
    port.checked_add(PORT_OFFSET).unwrap_or(port - PORT_OFFSET)
}

type Get<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Where one launcher's ranks meet, before names are resolved.
#[derive(Debug, Clone)]
enum Route {
    At { host: String, port: u16, why: String },
    Pmix { single_node: bool, fallback: Option<Box<Route>>, why: String },
    Nowhere(String),
}

/// One launcher's account of this process.
#[derive(Debug, Clone)]
struct Claim {
    launcher: Launcher,
    rank: u32,
    size: u32,
    local: Option<(u32, u32)>,
    node: Option<u32>,
    device: Option<i32>,
    /// The variables it rests on, for messages.
    from: String,
    /// The launcher certainly started this very process (torchrun's TORCHELASTIC_RUN_ID): an
    /// outer launcher of the same size with another rank is nesting, not a conflict.
    certain: bool,
    /// Names the job, the same on every rank: the derived token.
    job: String,
    route: Route,
}

impl Claim {
    fn says(&self) -> String {
        format!("{} says rank {} of {} ({})", self.launcher.name(), self.rank, self.size, self.from)
    }

    /// Whether the world spans several hosts, as far as the launcher tells.
    fn multi_node(&self) -> bool {
        self.local.is_some_and(|(_, n)| n < self.size)
    }
}

/// A launcher's variables: `None` when they are absent, an error when present but unusable.
type Found = std::result::Result<Option<Claim>, String>;

fn num(get: Get, name: &str, what: &str) -> std::result::Result<Option<u32>, String> {
    get(name).map(|v| parse::<u32>(name, &v, what).map_err(|e| e.message().to_owned())).transpose()
}

fn set(get: Get, name: &str) -> Option<String> {
    get(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

fn rank_below(rank: u32, size: u32, names: &str) -> std::result::Result<(), String> {
    if size == 0 || rank >= size {
        return Err(format!("{names}: rank {rank} is not below size {size}"));
    }
    Ok(())
}

/// Whether the launcher's PMIx server is reachable from this process (and not turned off).
fn pmix_here(get: Get) -> std::result::Result<bool, String> {
    let on = match set(get, "HCCN_PMIX").as_deref() {
        None | Some("auto") => true,
        Some("off") => false,
        Some(v) => return Err(format!("HCCN_PMIX={v:?} is not `auto` or `off`")),
    };
    Ok(on && set(get, "PMIX_RANK").is_some() && set(get, "PMIX_NAMESPACE").is_some())
}

fn hccn(get: Get) -> Found {
    let (rank, size) = (num(get, "HCCN_RANK", "a rank")?, num(get, "HCCN_WORLD_SIZE", "a world size")?);
    let (rank, size) = match (rank, size) {
        (None, None) => return Ok(None),
        (Some(r), Some(s)) => (r, s),
        (Some(_), None) => return Err("HCCN_RANK is set but HCCN_WORLD_SIZE is not (hccnrun sets both)".into()),
        (None, Some(_)) => return Err("HCCN_WORLD_SIZE is set but HCCN_RANK is not (hccnrun sets both)".into()),
    };
    if size == 0 || rank >= size {
        return Err(format!("HCCN_RANK={rank} is not below HCCN_WORLD_SIZE={size}"));
    }
    let local = (num(get, "HCCN_LOCAL_RANK", "a rank")?.unwrap_or(rank), num(get, "HCCN_LOCAL_WORLD_SIZE", "a size")?);
    Ok(Some(Claim {
        launcher: Launcher::Hccn,
        rank,
        size,
        local: Some((local.0, local.1.unwrap_or(size))),
        node: None,
        device: None,
        from: "HCCN_RANK, HCCN_WORLD_SIZE".into(),
        certain: true,
        job: String::new(),
        route: Route::Nowhere(
            "HCCN_STORE is not set (hccnrun sets it with HCCN_RANK; set by hand, set it too: tcp://host:port or etcd://...)"
                .into(),
        ),
    }))
}

fn torchrun(get: Get) -> Found {
    let (rank, size) = match (num(get, "RANK", "a rank")?, num(get, "WORLD_SIZE", "a world size")?) {
        (None, None) => return Ok(None),
        (Some(r), Some(s)) => (r, s),
        (Some(_), None) => return Err("RANK is set but WORLD_SIZE is not (torchrun sets both)".into()),
        (None, Some(_)) => return Err("WORLD_SIZE is set but RANK is not (torchrun sets both)".into()),
    };
    rank_below(rank, size, "RANK, WORLD_SIZE")?;
    // Without the pair (Kubeflow's PyTorchJob without torchrun, ranks started by hand) nothing
    // says which ranks share a host.
    let local = match (num(get, "LOCAL_RANK", "a rank")?, num(get, "LOCAL_WORLD_SIZE", "a size")?) {
        (Some(r), Some(n)) => Some((r, n)),
        _ => None,
    };
    let run = set(get, "TORCHELASTIC_RUN_ID");
    let (addr, port) = (set(get, "MASTER_ADDR"), num(get, "MASTER_PORT", "a port")?);
    let route = match (addr, port) {
        (Some(host), Some(p)) if p > 0 && p <= u32::from(u16::MAX) => {
            let port = offset_port(p as u16);
            let why =
                format!("rank 0 hosts it at MASTER_ADDR, port {port} beside MASTER_PORT, which torchrun binds itself");
            Route::At { host, port, why }
        }
        (_, Some(p)) if p == 0 || p > u32::from(u16::MAX) => return Err(format!("MASTER_PORT={p} is not a port")),
        _ => Route::Nowhere(
            "RANK and WORLD_SIZE are set but MASTER_ADDR or MASTER_PORT is not (torchrun sets all four)".into(),
        ),
    };
    Ok(Some(Claim {
        launcher: Launcher::Torchrun,
        rank,
        size,
        local,
        node: num(get, "GROUP_RANK", "a node rank")?,
        device: None,
        from: "RANK, WORLD_SIZE".into(),
        certain: run.is_some(),
        job: format!("torchrun/{}/{}", get("MASTER_PORT").unwrap_or_default(), run.unwrap_or_default()),
        route,
    }))
}

fn msrun(get: Get) -> Found {
    let role = set(get, "MS_ROLE");
    let workers = num(get, "MS_WORKER_NUM", "a number of workers")?;
    match (role.as_deref(), workers) {
        (None, None) => return Ok(None),
        (Some("MS_WORKER") | None, _) => {}
        (Some(role), _) => {
            return Err(format!(
                "MS_ROLE={role}: this process is msrun's scheduler (or another non-worker role), not a rank"
            ))
        }
    }
    let size = workers.ok_or("MS_ROLE=MS_WORKER is set but MS_WORKER_NUM is not (msrun sets both)")?;
    let rank = ["MS_NODE_ID", "RANK_ID"].iter().find_map(|v| set(get, v)?.parse::<u32>().ok()).ok_or(
        "msrun gave this worker no rank (MS_NODE_ID and RANK_ID unset or not numbers: on several nodes without \
         --node_rank MindSpore's scheduler numbers the workers later); pass msrun --node_rank",
    )?;
    rank_below(rank, size, "MS_NODE_ID, MS_WORKER_NUM")?;
    let route = match (set(get, "MS_SCHED_HOST"), num(get, "MS_SCHED_PORT", "a port")?) {
        (Some(host), Some(p)) if p > 0 && p <= u32::from(u16::MAX) => {
            let port = offset_port(p as u16);
            Route::At {
                host,
                port,
                why: format!("rank 0 hosts it at MS_SCHED_HOST, port {port} (msrun's scheduler binds MS_SCHED_PORT)"),
            }
        }
        _ => Route::Nowhere("MS_SCHED_HOST or MS_SCHED_PORT is not set (msrun sets them)".into()),
    };
    Ok(Some(Claim {
        launcher: Launcher::Msrun,
        rank,
        size,
        local: None,
        node: None,
        device: None,
        from: "MS_NODE_ID, MS_WORKER_NUM".into(),
        certain: false,
        job: format!("msrun/{}", get("MS_SCHED_PORT").unwrap_or_default()),
        route,
    }))
}

/// The route of an MPI launcher, which tells no meeting point: PMIx, else one host's loopback.
fn mpi_route(get: Get, single_node: bool, job: Option<&str>, what: &str) -> std::result::Result<Route, String> {
    let local = job.filter(|_| single_node).map(|job| {
        let port = derived_port(job);
        Route::At {
            host: "127.0.0.1".into(),
            port,
            why: format!("rank 0 hosts it on loopback, port {port} derived from {what}"),
        }
    });
    if pmix_here(get)? {
        let why = "rank 0 hosts it and tells the others through the launcher's PMIx (PMIX_NAMESPACE)".into();
        return Ok(Route::Pmix { single_node, fallback: local.map(Box::new), why });
    }
    Ok(local.unwrap_or_else(|| {
        Route::Nowhere(format!(
            "{what}: ranks on several hosts and no PMIx (PMIX_RANK unset, or HCCN_PMIX=off): set HCCN_STORE, or launch with PMIx"
        ))
    }))
}

fn open_mpi(get: Get) -> Found {
    let (rank, size) = match (num(get, "OMPI_COMM_WORLD_RANK", "a rank")?, num(get, "OMPI_COMM_WORLD_SIZE", "a size")?)
    {
        (None, None) => return Ok(None),
        (Some(r), Some(s)) => (r, s),
        _ => return Err("only one of OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE is set (mpirun sets both)".into()),
    };
    rank_below(rank, size, "OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE")?;
    let local =
        match (num(get, "OMPI_COMM_WORLD_LOCAL_RANK", "a rank")?, num(get, "OMPI_COMM_WORLD_LOCAL_SIZE", "a size")?) {
            (Some(r), Some(n)) => Some((r, n)),
            _ => None,
        };
    let job = set(get, "PMIX_NAMESPACE").or_else(|| set(get, "OMPI_MCA_ess_base_jobid"));
    let single = local.is_some_and(|(_, n)| n == size);
    Ok(Some(Claim {
        launcher: Launcher::OpenMpi,
        rank,
        size,
        local,
        node: None,
        device: None,
        from: "OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE".into(),
        certain: false,
        job: format!("ompi/{}", job.clone().unwrap_or_default()),
        route: mpi_route(get, single, job.as_deref(), "the job id (PMIX_NAMESPACE)")?,
    }))
}

fn pmi(get: Get) -> Found {
    let (rank, size) = match (num(get, "PMI_RANK", "a rank")?, num(get, "PMI_SIZE", "a size")?) {
        (None, None) => return Ok(None),
        (Some(r), Some(s)) => (r, s),
        _ => return Err("only one of PMI_RANK and PMI_SIZE is set (the launcher sets both)".into()),
    };
    rank_below(rank, size, "PMI_RANK, PMI_SIZE")?;
    let pair = |r: &str, n: &str| -> std::result::Result<Option<(u32, u32)>, String> {
        Ok(num(get, r, "a rank")?.zip(num(get, n, "a size")?))
    };
    let local = pair("MPI_LOCALRANKID", "MPI_LOCALNRANKS")?.or(pair("PMI_LOCAL_RANK", "PMI_LOCAL_SIZE")?);
    // Hydra names no job: its ranks on one host are children of the one proxy.
    // SAFETY: getppid cannot fail and touches no memory.
    let job = set(get, "PMI_JOBID").unwrap_or_else(|| format!("ppid{}", unsafe { libc::getppid() }));
    let single = local.is_some_and(|(_, n)| n == size);
    Ok(Some(Claim {
        launcher: Launcher::Pmi,
        rank,
        size,
        local,
        node: None,
        device: None,
        from: "PMI_RANK, PMI_SIZE".into(),
        certain: false,
        job: format!("pmi/{job}"),
        route: mpi_route(get, single, Some(&job), "the job (PMI_JOBID, else the launcher's process id)")?,
    }))
}

fn slurm(get: Get) -> Found {
    let step = num(get, "SLURM_STEP_ID", "a step id")?;
    let (procid, ntasks) = (num(get, "SLURM_PROCID", "a task id")?, num(get, "SLURM_NTASKS", "a task count")?);
    let Some(job) = set(get, "SLURM_JOB_ID") else {
        if step.or(procid).or(ntasks).is_some() {
            return Err(
                "SLURM_PROCID, SLURM_NTASKS or SLURM_STEP_ID is set but SLURM_JOB_ID is not (srun sets them all)"
                    .into(),
            );
        }
        return Ok(None);
    };
    // The batch step, the interactive step and the extern step have ids near 2^32.
    let Some(step) = step.filter(|s| *s < 0xffff_fff0) else {
        return Err(format!(
            "Slurm variables of job {job} outside a job step (a batch script or an salloc shell: SLURM_NTASKS={} \
             counts the tasks to come, not processes that exist): start the ranks with srun",
            get("SLURM_NTASKS").unwrap_or_else(|| "?".into())
        ));
    };
    let (Some(rank), Some(size)) = (procid, ntasks) else {
        return Err(format!("job step {job}.{step}: SLURM_PROCID or SLURM_NTASKS is not set (srun sets both)"));
    };
    rank_below(rank, size, "SLURM_PROCID, SLURM_NTASKS")?;
    let node = num(get, "SLURM_NODEID", "a node index")?;
    let bad = |why: String| format!("job step {job}.{step}: {why}");
    let hosts = set(get, "SLURM_STEP_NODELIST").map(|l| expand_hosts(&l).map_err(&bad)).transpose()?;
    let counts = set(get, "SLURM_STEP_TASKS_PER_NODE").map(|l| expand_counts(&l).map_err(&bad)).transpose()?;
    if let Some(c) = &counts {
        if c.iter().map(|&n| u64::from(n)).sum::<u64>() != u64::from(size) {
            return Err(bad(format!(
                "SLURM_STEP_TASKS_PER_NODE counts {} tasks, SLURM_NTASKS {size}",
                c.iter().sum::<u32>()
            )));
        }
        if hosts.as_ref().is_some_and(|h| h.len() != c.len()) {
            return Err(
                bad("SLURM_STEP_NODELIST and SLURM_STEP_TASKS_PER_NODE name different numbers of nodes".into()),
            );
        }
    }
    let local_size = counts.as_ref().zip(node).and_then(|(c, n)| c.get(n as usize).copied());
    let local = num(get, "SLURM_LOCALID", "a task id")?.zip(local_size);
    let nodes = hosts.as_ref().map(Vec::len).or(counts.as_ref().map(Vec::len));
    let id = format!("{job}.{step}");
    let route = slurm_route(get, &id, nodes, hosts.as_ref().and_then(|h| h.first()).cloned())?;
    Ok(Some(Claim {
        launcher: Launcher::Slurm,
        rank,
        size,
        local,
        node,
        device: None,
        from: format!("SLURM_PROCID, SLURM_NTASKS of job step {id}"),
        certain: false,
        job: format!("slurm/{id}"),
        route,
    }))
}

/// A one-node step meets on loopback; a larger one through PMIx where srun runs it, else on the
/// step's first node; on a port derived from the step's `JOB.STEP`.
fn slurm_route(get: Get, id: &str, nodes: Option<usize>, first: Option<String>) -> std::result::Result<Route, String> {
    let port = derived_port(id);
    if nodes == Some(1) {
        let why =
            format!("the step runs on one node: rank 0 hosts it on loopback, port {port} derived from job step {id}");
        return Ok(Route::At { host: "127.0.0.1".into(), port, why });
    }
    let at = first.map(|host| Route::At {
        port,
        why: format!("rank 0 hosts it on the step's first node {host}, port {port} derived from job step {id}"),
        host,
    });
    if pmix_here(get)? {
        let why = "rank 0 hosts it and tells the others through Slurm's PMIx (srun --mpi=pmix)".into();
        return Ok(Route::Pmix { single_node: false, fallback: at.map(Box::new), why });
    }
    Ok(at.unwrap_or_else(|| Route::Nowhere(format!("job step {id}: SLURM_STEP_NODELIST is not set (srun sets it)"))))
}

fn rank_table(get: Get) -> Found {
    let Some((var, path)) =
        ["RANK_TABLE_FILE", "MINDSPORE_HCCL_CONFIG_PATH"].iter().find_map(|v| set(get, v).map(|p| (*v, p)))
    else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{var}={path}: cannot read it: {e}"))?;
    let table = RankTable::parse(&text).map_err(|why| format!("{var}={path}: {why}"))?;
    let size = table.size();
    let rank = num(get, "RANK_ID", "a rank")?.ok_or_else(|| {
        format!("{var} is set but RANK_ID is not: set RANK_ID to this process's rank_id in {path} (0..{size})")
    })?;
    let place = table
        .place(rank)
        .ok_or_else(|| format!("RANK_ID={rank} is not in {var}={path}, whose ranks are 0..{size} (exclusive)"))?;
    let port = derived_port(&format!("{:x}", table.digest));
    let route = match (table.servers.len(), table.rank0_server()) {
        (1, _) => Route::At {
            host: "127.0.0.1".into(),
            port,
            why: format!("the table has one server: rank 0 hosts it on loopback, port {port} derived from the table"),
        },
        (_, Some(s)) => Route::At {
            host: s.address.clone(),
            port,
            why: format!("rank 0 hosts it on its server {}, port {port} derived from the table", s.address),
        },
        (_, None) => Route::Nowhere(format!("{var}={path} has no rank 0")),
    };
    Ok(Some(Claim {
        launcher: Launcher::RankTable,
        rank,
        size,
        local: Some((place.local_rank, place.local_size)),
        node: Some(place.server),
        device: Some(place.device_id),
        from: format!("RANK_ID, {var} (version {})", table.version),
        certain: false,
        job: format!("ranktable/{:x}", table.digest),
        route,
    }))
}

/// Innermost first (see the module's comment).
const CLAIMS: [fn(Get) -> Found; 6] = [torchrun, msrun, open_mpi, pmi, slurm, rank_table];

const NONE_FOUND: &str = "no launcher found: none of HCCN_RANK (hccnrun), RANK and WORLD_SIZE (torchrun), \
     SLURM_PROCID in a job step (srun), OMPI_COMM_WORLD_RANK (Open MPI mpirun) or PMI_RANK (MPICH mpiexec), MS_WORKER_NUM (msrun), \
     RANK_TABLE_FILE with RANK_ID (the Ascend rank table) is set: start the program with one of them, or set \
     HCCN_RANK, HCCN_WORLD_SIZE and HCCN_STORE";

/// The claim this process follows, and how the others fit it; `None` when no launcher's
/// variable is set at all.
fn choose(get: Get) -> Result<Option<(Claim, Vec<Claim>)>> {
    if let Some(c) = hccn(get).map_err(Error::invalid)? {
        return Ok(Some((c, Vec::new())));
    }
    let (mut found, mut unusable) = (Vec::new(), Vec::new());
    for claim in CLAIMS {
        match claim(get) {
            Ok(Some(c)) => found.push(c),
            Ok(None) => {}
            Err(why) => unusable.push(why),
        }
    }
    if found.is_empty() {
        return if unusable.is_empty() { Ok(None) } else { Err(Error::invalid(unusable.join("; "))) };
    }
    let chosen = found.remove(0);
    for outer in &found {
        let nested = outer.size < chosen.size;
        let same = outer.size == chosen.size && (outer.rank == chosen.rank || chosen.certain);
        if !nested && !same {
            return Err(Error::invalid(format!(
                "conflicting launchers: {} but {}; one of them is left over from another job: unset its variables, \
                 or set HCCN_RANK, HCCN_WORLD_SIZE and HCCN_STORE",
                chosen.says(),
                outer.says()
            )));
        }
    }
    Ok(Some((chosen, found)))
}

/// The address `host` names, IPv4 first (as every rank resolves it alike).
fn resolve(host: &str, port: u16) -> std::result::Result<SocketAddr, String> {
    let addrs: Vec<SocketAddr> =
        (host, port).to_socket_addrs().map_err(|e| format!("{host} does not resolve: {e}"))?.collect();
    addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()).copied().ok_or_else(|| format!("{host} resolves to nothing"))
}

/// A route made concrete: names resolved, rank 0's listening address chosen.
fn meet_at(route: &Route, claim: &Claim, bind: Option<IpAddr>) -> Result<(Meet, String)> {
    match route {
        Route::At { host, port, why } => {
            let dial = resolve(host, *port).map_err(|e| Error::invalid(format!("the store's host: {e}")))?;
            if dial.ip().is_loopback() && claim.multi_node() && bind.is_none() {
                return Err(Error::invalid(format!(
                    "{} puts the store at {host} ({}), this host only, but the ranks are on several hosts: \
                     name rank 0's host by an address the others reach, or set HCCN_STORE",
                    claim.launcher.name(),
                    dial.ip()
                )));
            }
            let listen = SocketAddr::new(bind.unwrap_or(dial.ip()), *port);
            Ok((Meet::Rank0 { dial, listen }, why.clone()))
        }
        Route::Pmix { single_node, fallback, why } => {
            let fallback = match fallback {
                Some(f) => Some(Box::new(meet_at(f, claim, bind)?.0)),
                None => None,
            };
            Ok((Meet::Pmix { single_node: *single_node, fallback }, why.clone()))
        }
        Route::Nowhere(why) => Err(Error::invalid(why.clone())),
    }
}

impl LaunchEnv {
    pub fn from_env() -> Result<Self> {
        LaunchEnv::from_lookup(|k| std::env::var(k).ok())
    }

    /// Detects the launcher through `get` (tests pass a map); no launcher is an error.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        LaunchEnv::detect(get)?.ok_or_else(|| Error::invalid(NONE_FOUND))
    }

    /// [`LaunchEnv::detect`] on the process environment.
    pub fn detect_env() -> Result<Option<Self>> {
        LaunchEnv::detect(|k| std::env::var(k).ok())
    }

    /// The launcher `get` describes, `None` where no launcher's variable is set at all (a
    /// program run by hand: hccn-info then makes a world of one).
    pub fn detect(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let get: Get = &get;
        let Some((claim, others)) = choose(get)? else { return Ok(None) };
        let bind = get("HCCN_BIND_ADDR").map(|v| parse::<IpAddr>("HCCN_BIND_ADDR", &v, "an IP address")).transpose()?;
        let (meet, why) = match set(get, "HCCN_STORE") {
            Some(url) => {
                let store = StoreAddr::parse(&url)?.with_etcd_access(etcd_access(&get)?);
                (Meet::Store(store), "HCCN_STORE names it".to_owned())
            }
            None => {
                // A claim with no meeting point of its own may use that of a claim of the same world.
                let route = std::iter::once(&claim)
                    .chain(others.iter().filter(|o| (o.rank, o.size) == (claim.rank, claim.size)))
                    .map(|c| &c.route)
                    .find(|r| !matches!(r, Route::Nowhere(_)))
                    .unwrap_or(&claim.route);
                meet_at(route, &claim, bind)?
            }
        };
        let token = set(get, "HCCN_JOB_TOKEN");
        let (local_rank, local_world_size) = claim.local.unwrap_or((claim.rank, claim.size));
        let also = others.iter().map(|o| format!("{} (an outer launcher, or the same processes)", o.says())).collect();
        Ok(Some(LaunchEnv {
            launcher: claim.launcher,
            rank: claim.rank,
            world_size: claim.size,
            local_rank,
            local_world_size,
            node: claim.node,
            meet,
            why,
            job_id: get("HCCN_JOB_ID").unwrap_or_else(|| "default".to_owned()),
            // HCCN_* set by hand without a token: the empty one, as ever.
            job_token: match (&token, claim.launcher) {
                (Some(t), _) => t.clone().into_bytes(),
                (None, Launcher::Hccn) => Vec::new(),
                (None, _) => format!("hccn/{}", claim.job).into_bytes(),
            },
            token_given: token.is_some(),
            bind_given: bind.is_some(),
            device_id: claim.device,
            pmix_lib: set(get, "HCCN_PMIX_LIB").map(PathBuf::from),
            also,
        }))
    }

    /// What was detected, one fact a line (hccn-info prints it).
    pub fn describe(&self) -> Vec<String> {
        let node = self.node.map_or(String::new(), |n| format!(" on node {n}"));
        let mut lines = vec![
            format!("launcher: {}", self.launcher.name()),
            format!(
                "rank {} of {}, local rank {} of {}{node}",
                self.rank, self.world_size, self.local_rank, self.local_world_size
            ),
        ];
        let store = match &self.meet {
            Meet::Store(s) => format!("store: {s}"),
            Meet::Rank0 { dial, .. } => format!("store: tcp://{dial}"),
            Meet::Pmix { .. } => "store: a free port on rank 0's host, through PMIx".to_owned(),
        };
        lines.push(format!("{store} ({})", self.why));
        lines.extend(self.also.iter().map(|a| format!("also: {a}")));
        lines
    }
}

#[cfg(test)]
#[path = "launcher_tests.rs"]
mod tests;
