//! A job's runs on a store that outlives them (etcd). The same `HCCN_JOB_ID` may be run again,
//! after a clean end or a crash; each run gets a generation of its own, and records of earlier
//! ones are never read.
//!
//! Keys under the job's root `job/<id>`:
//! - `run`: the current generation `g` (u64, little endian; absent means none yet);
//! - `live/<g>/<me>`: one per process that takes part in generation `g` (a world of it, from
//!   `hccn_init_from_env` until its last communicator is destroyed), bound to a lease, so it
//!   vanishes when the process dies or freezes;
//! - `entered/<g>/<me>` and `left/<g>/<me>`: written when a process enters and when it leaves on
//!   purpose, so that the last one to leave knows whether everyone did (a clean end);
//! - `g<g>/world<n>/...`: the records of the process's n-th world in generation `g` (addresses,
//!   `formed`, the join queue, epoch decisions, membership keys).
//!
//! A process arriving for its n-th world reads `run`. If a process of that generation is alive
//! and the world has formed, it is a replacement: it waits in the world's join queue (and gives
//! up waiting if the generation dies meanwhile). Otherwise it enters: in one compare-and-swap it
//! either joins generation `g` (still current, and someone is alive in it: a run that is
//! forming) or starts `g + 1` (still current, and nobody is alive in it: the previous run ended
//! or crashed), deleting `g`'s records. Both steps compare `run` and the liveness of `g`
//! atomically, so two processes can never end up in different generations of one run, and a
//! crashed run's records are never dialled. When the last process of a generation leaves and
//! every process that entered left on purpose, it deletes the job's keys; `hccnrun` does the
//! same after a job whose ranks all exited 0 (when ranks exit without destroying, their leases
//! expire first).
//!
//! Stores that live only as long as one run (the embedded one) have one generation, always
//! live: the trait's default methods.

use crate::rendezvous::Member;

/// The root of a job's keys.
pub fn job_root(job_id: &str) -> String {
    format!("job/{job_id}")
}

/// The current generation's key.
pub fn generation_key(job: &str) -> String {
    format!("{job}/run")
}

/// Presence keys of generation `g` (leased).
pub fn live_prefix(job: &str, g: u64) -> String {
    format!("{job}/live/{g}/")
}

/// Processes that entered generation `g`.
pub fn entered_prefix(job: &str, g: u64) -> String {
    format!("{job}/entered/{g}/")
}

/// Processes that left generation `g` on purpose.
pub fn left_prefix(job: &str, g: u64) -> String {
    format!("{job}/left/{g}/")
}

/// Records of generation `g`.
pub fn generation_prefix(job: &str, g: u64) -> String {
    format!("{job}/g{g}/")
}

/// The key prefix of a process's `nth` world in generation `g` of `job`.
pub fn world_prefix(job: &str, g: u64, nth: u64) -> String {
    format!("{job}/g{g}/world{nth}")
}

/// What a process arriving sees of the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunState {
    /// The current generation (0: none yet).
    pub generation: u64,
    /// Whether a process of it is alive.
    pub live: bool,
}

impl RunState {
    /// A store that lives for one run only.
    pub const SINGLE: RunState = RunState { generation: 1, live: true };
}

/// A process's entry into a generation.
pub struct Entered {
    pub generation: u64,
    /// Its presence; dropping it leaves the generation (and may clean up the job's keys).
    pub presence: Option<Member>,
}

impl std::fmt::Debug for Entered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entered").field("generation", &self.generation).finish()
    }
}

/// How far the first world of a job's current run has come, as a launcher sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Formation {
    /// None of the ranks asked about has registered yet (or the program does not use
    /// `hccn_init_from_env`).
    NotStarted,
    /// Some rank has registered; the others wait for the rest.
    Forming,
    /// Every rank connected.
    Formed,
}

/// Where the first world of job `job_id` is; `ranks` are those whose registration counts (a
/// few are enough: each rank registers as soon as it starts).
pub fn first_world(store: &dyn super::Store, job_id: &str, ranks: &[u32]) -> crate::Result<Formation> {
    let job = job_root(job_id);
    let seen = store.run_state(&job)?;
    if seen.generation == 0 || !seen.live {
        // Nobody has entered this run yet (what is there belongs to an ended one).
        return Ok(Formation::NotStarted);
    }
    let prefix = world_prefix(&job, seen.generation, 0);
    let set = |key: &str| match store.get(key, std::time::Duration::ZERO) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == crate::ErrorKind::Timeout => Ok(false),
        Err(e) => Err(e),
    };
    if set(&crate::comm::join::formed_key(&prefix))? {
        return Ok(Formation::Formed);
    }
    // Each rank publishes its address first thing (rendezvous/bootstrap.rs, connect_mesh).
    for r in ranks {
        if set(&format!("{prefix}/addr/{r}"))? {
            return Ok(Formation::Forming);
        }
    }
    Ok(Formation::NotStarted)
}
