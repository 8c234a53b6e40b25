//! What hccnrun learns from the job's store: whether the world has formed (a rank that exits
//! before it does leaves the others waiting for it until their timeout, so hccnrun ends the job
//! at once), and, after a clean end, the removal of the job's keys from a store that outlives it.

use std::time::{Duration, Instant};

use hccn_runtime::rendezvous::runs::{self, Formation};
use hccn_runtime::rendezvous::Store;
use hccn_runtime::{Config, StoreAddr};

/// The longest hccnrun waits for the store while it watches ranks: it must keep up with
/// signals and other ranks.
const WATCH_TIMEOUT: Duration = Duration::from_secs(3);

/// A connection to the job's store, made when first needed.
pub struct World {
    url: String,
    token: Vec<u8>,
    cfg: Config,
    job_id: String,
    store: Option<Box<dyn Store>>,
    /// The connection failed once: hccnrun does without.
    unavailable: bool,
    /// Another connection says so when the store cannot be reached.
    quiet: bool,
    formed: bool,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World").field("url", &self.url).field("job_id", &self.job_id).finish()
    }
}

impl World {
    pub fn new(url: &str, token: &[u8], cfg: &Config, job_id: &str) -> World {
        World {
            url: url.to_owned(),
            token: token.to_vec(),
            cfg: cfg.clone(),
            job_id: job_id.to_owned(),
            store: None,
            unavailable: false,
            quiet: false,
            formed: false,
        }
    }

    /// A second connection to the same store, which does not repeat this one's complaints.
    pub fn another(&self) -> World {
        World { quiet: true, ..World::new(&self.url, &self.token, &self.cfg, &self.job_id) }
    }

    fn store(&mut self, timeout: Duration) -> Option<&dyn Store> {
        if self.store.is_none() && !self.unavailable {
            hccn_recovery::install();
            let connected = StoreAddr::parse(&self.url)
                .map(|a| a.with_etcd_access(self.cfg.etcd.clone()))
                .and_then(|a| a.connect(&self.token, timeout));
            match connected {
                Ok(s) => self.store = Some(s),
                Err(e) => {
                    if !self.quiet {
                        crate::launch::say(format_args!("cannot watch the job's store ({e}); a rank that exits early is noticed only by the others' timeout"));
                    }
                    self.unavailable = true;
                }
            }
        }
        self.store.as_deref()
    }

    /// Whether the store can be asked (it answered, or has not been tried yet).
    pub fn available(&self) -> bool {
        !self.unavailable
    }

    /// The value of `key`, waiting up to `wait` for it; `None` when it is not set by then or
    /// the store does not answer.
    pub fn value(&mut self, key: &str, wait: Duration) -> Option<Vec<u8>> {
        self.store(WATCH_TIMEOUT.min(self.cfg.timeout))?.get(key, wait).ok()
    }

    /// The generation of the job rooted at `job` whose processes are alive, if any.
    pub fn live_generation(&mut self, job: &str) -> Option<u64> {
        let state = self.store(WATCH_TIMEOUT.min(self.cfg.timeout))?.run_state(job).ok()?;
        state.live.then_some(state.generation)
    }

    /// How far the first world has come; `running` are ranks still running here (their
    /// registration counts). `None` when the store cannot tell.
    pub fn formation(&mut self, running: &[u32]) -> Option<Formation> {
        if self.formed {
            return Some(Formation::Formed);
        }
        let job_id = self.job_id.clone();
        let asked: Vec<u32> = running.iter().copied().take(4).collect();
        let store = self.store(WATCH_TIMEOUT.min(self.cfg.timeout))?;
        match runs::first_world(store, &job_id, &asked) {
            Ok(f) => {
                self.formed = f == Formation::Formed;
                Some(f)
            }
            Err(e) => {
                crate::launch::say(format_args!("the job's store did not answer: {e}"));
                None
            }
        }
    }

    /// After a job whose ranks all exited 0: removes the job's keys from a store that outlives
    /// it, waiting for the leases of ranks that exited without destroying their communicators
    /// to expire. Quiet when other hosts' ranks still run (their keys stay; the last of them
    /// removes them when it leaves).
    pub fn clean_up(&mut self) {
        let wait = self.cfg.lease_ttl + Duration::from_secs(2);
        let job = runs::job_root(&self.job_id);
        let Some(store) = self.store(self.cfg.timeout) else { return };
        let deadline = Instant::now() + wait;
        loop {
            match store.remove_job_if_idle(&job) {
                Ok(true) => return,
                Ok(false) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                Ok(false) => return,
                Err(e) => {
                    crate::launch::say(format_args!("the job's keys stay in the store: {e}"));
                    return;
                }
            }
        }
    }
}

/// Ranks that exited before the world formed, kept until it is clear whether others wait for
/// them: once any other rank has registered, the world can never form, and the job ends.
#[derive(Debug, Default)]
pub struct EarlyExits {
    /// Rank, what happened to it (e.g. "exited with code 3"), hccnrun's exit code for it.
    exited: Vec<(u32, String, i32)>,
    next_look: Option<Instant>,
    /// When the first of them was seen.
    first_seen: Option<Instant>,
}

/// How often hccnrun asks the store while ranks that exited early may be waited for.
const LOOK_EVERY: Duration = Duration::from_millis(100);
/// How long the others get to end on their own after an early exit: a rank that fails the
/// meeting (world sizes that differ, a bad store) usually does so on every rank at once, and
/// each one's own message says more than hccnrun's SIGTERM.
const OTHERS_MAY_END: Duration = Duration::from_secs(2);

impl EarlyExits {
    /// Takes the ranks that just exited (`rank`, what happened, exit code) and says, with the
    /// exit code for hccnrun, why the job must end now, if it must. `running`: ranks still running.
    pub fn check(
        &mut self,
        world: &mut World,
        exited: Vec<(u32, String, i32)>,
        running: &[u32],
    ) -> Option<(String, i32)> {
        let fresh = !exited.is_empty();
        if world.formed {
            return None;
        }
        self.exited.extend(exited);
        let now = Instant::now();
        if self.exited.is_empty() || (!fresh && self.next_look.is_some_and(|t| now < t)) {
            return None;
        }
        self.next_look = Some(now + LOOK_EVERY);
        if now < *self.first_seen.get_or_insert(now) + OTHERS_MAY_END {
            return None;
        }
        match world.formation(running)? {
            Formation::Formed => {
                // They left a world that had formed (the exit was seen late): nothing to do here.
                self.exited.clear();
                self.first_seen = None;
                None
            }
            Formation::NotStarted => None,
            Formation::Forming => {
                let who: Vec<String> = self.exited.iter().map(|(r, how, _)| format!("rank {r} {how}")).collect();
                let code = self.exited.iter().map(|(_, _, c)| *c).find(|&c| c != 0).unwrap_or(1);
                let why = format!(
                    "{} before the job's world formed; the ranks that joined would wait for it until their \
                     timeout (HCCN_TIMEOUT_MS, {} ms): stopping the job",
                    who.join(", "),
                    world.cfg.timeout.as_millis()
                );
                self.exited.clear();
                self.first_seen = None;
                Some((why, code))
            }
        }
    }
}
