//! What tunes a world's collectives, shared by every layer and owned by none: the algorithm a
//! user may force, the kinds of link and their costs (the cost model's α and β, see
//! `collectives::select`), and the board's bounds. Plain data: a leaf module, imported from
//! above (config parses it, collectives decide with it, the communicator owns a world's copy).

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
/// Link figures outside these ranges are a mistake (a unit, a measurement disturbed by load):
/// HCCN_LINK_COST refuses them and a measurement falls back to the built-in figures.
pub const LINK_ALPHA_US: std::ops::RangeInclusive<f64> = 0.05..=10_000.0;
pub const LINK_GBPS: std::ops::RangeInclusive<f64> = 0.05..=200.0;

/// Largest payload a board slot holds: allreduces up to this size use the board.
pub const BOARD_BYTES: usize = 4096;

/// An algorithm a user can ask for (`HCCN_ALGO`, `hccn-perf --algo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AlgoChoice {
    /// The cost model decides per operation.
    #[default]
    Auto,
    Ring,
    /// Recursive halving-doubling (Rabenseifner). Its small-buffer variant, recursive doubling
    /// (`rd`), is the model's choice only.
    Rhd,
    Tree,
    /// Hierarchical: intra-host reduce-scatter, inter-host allreduce, intra-host allgather.
    Hier,
}

impl AlgoChoice {
    pub const ALL: [AlgoChoice; 5] =
        [AlgoChoice::Auto, AlgoChoice::Ring, AlgoChoice::Rhd, AlgoChoice::Tree, AlgoChoice::Hier];

    pub fn name(self) -> &'static str {
        match self {
            AlgoChoice::Auto => "auto",
            AlgoChoice::Ring => "ring",
            AlgoChoice::Rhd => "rhd",
            AlgoChoice::Tree => "tree",
            AlgoChoice::Hier => "hier",
        }
    }

    pub fn from_name(name: &str) -> Option<AlgoChoice> {
        let name = name.trim().to_ascii_lowercase();
        AlgoChoice::ALL.into_iter().find(|a| a.name() == name)
    }

    pub fn names() -> Vec<&'static str> {
        AlgoChoice::ALL.iter().map(|a| a.name()).collect()
    }
}

/// How a rank reaches a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// The rank itself (through its own inbox).
    Local,
    Tcp,
    /// Shared memory between ranks of one host.
    Shm,
}

/// The cost of one link: `alpha` seconds per message, `beta` seconds per byte.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkCost {
    pub alpha: f64,
    pub beta: f64,
}

impl LinkCost {
    /// A link of `alpha_us` µs per message and `gbps` GB/s.
    pub fn new(alpha_us: f64, gbps: f64) -> LinkCost {
        LinkCost { alpha: alpha_us * 1e-6, beta: 1.0 / (gbps * 1e9) }
    }

    pub fn alpha_us(self) -> f64 {
        self.alpha * 1e6
    }

    pub fn gbps(self) -> f64 {
        1e-9 / self.beta
    }

    /// Seconds to move one message of `bytes`.
    pub(crate) fn msg(self, bytes: f64) -> f64 {
        self.alpha + bytes * self.beta
    }

    /// The worse of two links in latency and in bandwidth, each.
    pub(crate) fn worst(self, o: LinkCost) -> LinkCost {
        LinkCost { alpha: self.alpha.max(o.alpha), beta: self.beta.max(o.beta) }
    }
}

impl TransportKind {
    pub const ALL: [TransportKind; 3] = [TransportKind::Local, TransportKind::Shm, TransportKind::Tcp];

    /// Built-in cost, measured on the 2-core development machine.
    pub fn default_cost(self) -> LinkCost {
        match self {
            TransportKind::Local => LinkCost::new(LOCAL_ALPHA_US, LOCAL_GBPS),
            TransportKind::Tcp => LinkCost::new(TCP_ALPHA_US, TCP_GBPS),
            TransportKind::Shm => LinkCost::new(SHM_ALPHA_US, SHM_GBPS),
        }
    }

    /// The name HCCN_LINK_COST uses.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Local => "local",
            TransportKind::Tcp => "tcp",
            TransportKind::Shm => "shm",
        }
    }
}

/// The cost of every transport kind, as the cost model of a world's communicators sees them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkCosts {
    pub local: LinkCost,
    pub shm: LinkCost,
    pub tcp: LinkCost,
    /// World rank 0's host runs more ranks than it has cores (reported by hccn-perf and the
    /// agreement's log line; linkcost.rs measures a slow shared-memory α again only where not).
    /// The model itself does not use it: what once made the ring slow there (a receiver's
    /// single-copy read while its sender waits) is left out by the transport instead.
    pub shared_cores: bool,
}

impl LinkCosts {
    /// The built-in figures.
    pub fn builtin() -> LinkCosts {
        LinkCosts {
            local: TransportKind::Local.default_cost(),
            shm: TransportKind::Shm.default_cost(),
            tcp: TransportKind::Tcp.default_cost(),
            shared_cores: false,
        }
    }

    pub fn get(&self, kind: TransportKind) -> LinkCost {
        match kind {
            TransportKind::Local => self.local,
            TransportKind::Shm => self.shm,
            TransportKind::Tcp => self.tcp,
        }
    }

    pub fn set(&mut self, kind: TransportKind, cost: LinkCost) {
        match kind {
            TransportKind::Local => self.local = cost,
            TransportKind::Shm => self.shm = cost,
            TransportKind::Tcp => self.tcp = cost,
        }
    }
}

/// In HCCN_LINK_COST's syntax (`local=0.500us:10.000GB/s,shm=...,tcp=...`), so that a logged
/// value can be pasted into the variable.
impl std::fmt::Display for LinkCosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, kind) in TransportKind::ALL.into_iter().enumerate() {
            let c = self.get(kind);
            let sep = if i == 0 { "" } else { "," };
            write!(f, "{sep}{}={:.3}us:{:.3}GB/s", kind.name(), c.alpha_us(), c.gbps())?;
        }
        Ok(())
    }
}

/// A world's tuning, the same on every rank of it: every communicator over the world's
/// connections (groups, splits, shrinks, rebuilds) decides with it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tuning {
    /// `HCCN_ALGO` of the process.
    pub algo: AlgoChoice,
    /// `HCCN_BOARD_BYTES`.
    pub board_bytes: usize,
    /// How ranks of one host reach each other (`HCCN_TRANSPORT`), for the cost model.
    pub intra: TransportKind,
    /// The cost model's link figures: agreed by the world as it forms (`comm::linkcost`);
    /// built-in until then, and for joiners.
    pub costs: LinkCosts,
}
