//! A board in shared memory for the smallest collectives of a communicator whose ranks all share
//! one host: every rank posts its bytes in its own slot and reads all slots itself, in rank
//! order (an allreduce folds them, an allgather copies them, a broadcast takes the root's), so
//! the operation costs one round of waiting instead of log2 n rounds of messages. When the host's ranks outnumber its cores each round means a context
//! switch per core, which is what a tiny allreduce's time is made of.
//!
//! A rank has [`TURNS`] slots, used in turn by the communicator's board operations (numbered
//! alike on every rank when they are submitted, see `collectives/board.rs`). A slot holds a
//! sequence word (turn + 1 once written) and the payload (inline in the sequence word's cache
//! line when it is small). Each rank says in its own line, per slot index, the last turn it has
//! folded (itself included). A writer waits until every rank has folded what its slot held
//! `TURNS` turns ago, so no rank overwrites a buffer that another has yet to fold; a reader waits
//! for the sequence word. Every line has a single writer: no atomic read-modify-write on a line
//! that all ranks share (a shared read count took a fifth of a 4-byte allreduce's time). Waits
//! spin or yield as the rings do (see wait.rs), then sleep on the board's futex, woken by writes
//! and folds. Where the host's ranks outnumber its cores, each waiter says in its line which core
//! it runs on: a waiter spins rather than yields while no rank it waits for shares its core, and
//! the ranks keep themselves evenly spread over the cores (placement.rs).

use std::fs::OpenOptions;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::placement::{self, here, Countdown};
use super::shm::{demote, demote_small, futex_wait, futex_wake, Backoff, Segment, Wait, NAP};
use crate::error::{Error, Result};
use crate::wire::Fingerprint;

pub(crate) use crate::tuning::BOARD_BYTES;
/// Most ranks a board serves (its size grows with the ranks).
pub(crate) const BOARD_RANKS: u32 = 64;
/// Slots per rank: board operations that may be in flight at once on different streams. Seven
/// fill a rank's line with its core and its folded turns; a writer who reads another rank's line
/// learns enough for several turns to come (see `Board::known`).
const TURNS: u64 = 7;
const LINE: usize = 64;
/// The sequence word's line: the word, the call's fingerprint, then small payloads.
const FP_AT: usize = 8;
const INLINE_AT: usize = FP_AT + Fingerprint::BYTES;
/// Payloads up to this size travel in the sequence word's cache line.
const INLINE: usize = LINE - INLINE_AT;
/// Sequence line (with small payloads inline), then the payload.
const SLOT: usize = LINE + BOARD_BYTES;
const MAGIC: u64 = 0x4843_434e_4252_4432; // "HCCNBRD2"

/// Looks a waiter spends spinning (rather than yielding) while no rank it waits for shares its
/// core, when the host's ranks outnumber its cores.
const SPIN_LOOKS: u32 = 256;
/// Looks at the board per look at the communicator's health while waiting.
const HEALTH_EVERY: u32 = 8;
/// Bytes of a board for `n` ranks: a control line (magic, futex word, sleepers), a line per
/// rank (the core it last ran on, then per slot index the last turn + 1 it folded), then the slots.
fn board_bytes(n: u32) -> usize {
    LINE + n as usize * LINE + n as usize * TURNS as usize * SLOT
}

/// One communicator's board, mapped by each of its ranks.
pub(crate) struct Board {
    seg: Segment,
    n: u32,
    me: u32,
    wait: Wait,
    /// The `folded` words of every rank as this process last read them (rank * TURNS + slot
    /// index). They only grow, so a value seen here is still true: a writer reads a rank's line
    /// again (a cache miss on the critical path) only when what it saw last is not enough.
    known: Box<[AtomicU64]>,
    /// When this rank's waits look again whether its core is crowded.
    spread_in: Countdown,
}

// SAFETY: the mapping is shared memory accessed through atomics and through slots whose
// ownership the turn protocol hands over (see the module comment).
unsafe impl Send for Board {}
// SAFETY: as above.
unsafe impl Sync for Board {}

/// What a waiter does while it waits: `quick` after each look (cheap health checks), `stalled`
/// before each sleep (keep other traffic moving, warn of late ranks, the deadline; given who
/// is waited for, in words for people), `left` with which ranks are waited for (whether one of
/// them left: then it will never post). Each ends the wait with an error.
pub(crate) struct Watch<'a> {
    pub quick: &'a mut dyn FnMut() -> Result<()>,
    /// At each stall: which ranks the wait waits for, and why, in words.
    pub stalled: &'a mut Stalled<'a>,
    pub left: &'a LeftAmong<'a>,
    /// The error for a post of `rank` whose call differs (its fingerprint).
    pub differs: &'a dyn Fn(u32, &Fingerprint) -> Error,
}

/// Why a read waits for `rank`, in words for people: it has not made the call of `turn` yet;
/// `last` is the turn of its latest small collective on this communicator.
fn not_joined(rank: u32, turn: u64, last: Option<u64>) -> String {
    let last = match last {
        None => "it has made no small collective on this communicator yet".to_owned(),
        Some(t) => format!("it is {} small collective(s) behind", turn.saturating_sub(t)),
    };
    format!("rank {rank} has not joined this call ({last}; alive as far as this rank knows: busy in its own code, or in another call)")
}

/// Called at each stall of a wait: which ranks it waits for, and why, in words.
pub(crate) type Stalled<'a> = dyn FnMut(&dyn Fn(u32) -> bool, &dyn Fn() -> String) -> Result<()> + 'a;

/// Given which ranks a wait waits for, the error when one of them left.
pub(crate) type LeftAmong<'a> = dyn Fn(&dyn Fn(u32) -> bool) -> Option<Error> + 'a;

impl Board {
    /// Creates the board file at `path` (which must not exist) for `n` ranks and maps it.
    pub(super) fn create(path: &str, n: u32, me: u32, wait: Wait) -> std::io::Result<Board> {
        let len = board_bytes(n);
        let board = Board::new(Segment::create(path, len)?, n, me, wait);
        // No rank has said where it runs yet (0 would read as core 0).
        (0..n).for_each(|r| board.cpu(r).store(u32::MAX, Ordering::Relaxed));
        board.word64(0).store(MAGIC, Ordering::Release);
        Ok(board)
    }

    /// Maps the board another rank created at `path`, checking its size and mark.
    pub(super) fn open(path: &str, n: u32, me: u32, wait: Wait) -> std::io::Result<Board> {
        if !path.starts_with("/dev/shm/hccn-board-") || path.contains("..") {
            return Err(std::io::Error::other(format!(
                "{path:?} is not the shared memory of hccn's small collectives"
            )));
        }
        let len = board_bytes(n);
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let have = file.metadata()?.len();
        if have != len as u64 {
            return Err(std::io::Error::other(format!(
                "the shared memory of small collectives holds {have} bytes where {len} were expected"
            )));
        }
        let board = Board::new(Segment::map(&file, len)?, n, me, wait);
        if board.word64(0).load(Ordering::Acquire) != MAGIC {
            return Err(std::io::Error::other("the shared memory of small collectives is not set up yet"));
        }
        Ok(board)
    }

    fn new(seg: Segment, n: u32, me: u32, wait: Wait) -> Board {
        let known = (0..n as usize * TURNS as usize).map(|_| AtomicU64::new(0)).collect();
        Board { seg, n, me, wait, known, spread_in: Countdown::default() }
    }

    fn at(&self, off: usize) -> *mut u8 {
        debug_assert!(off < board_bytes(self.n));
        // SAFETY: every offset computed below lies inside the mapping (board_bytes(n)).
        unsafe { self.seg.ptr.add(off) }
    }
    fn word64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: an 8-byte aligned offset inside a live, page-aligned shared mapping, which is
        // only accessed atomically at this offset.
        unsafe { AtomicU64::from_ptr(self.at(off).cast()) }
    }
    fn word32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as in `word64`, 4-byte aligned.
        unsafe { AtomicU32::from_ptr(self.at(off).cast()) }
    }
    fn futex(&self) -> &AtomicU32 {
        self.word32(8)
    }
    fn sleepers(&self) -> &AtomicU32 {
        self.word32(12)
    }
    /// The core `rank` last ran on, as it last said.
    fn cpu(&self, rank: u32) -> &AtomicU32 {
        self.word32(LINE + rank as usize * LINE)
    }
    /// Records this rank's core, writing only on a change: other ranks poll this line.
    fn publish_cpu(&self, cpu: u32) {
        let word = self.cpu(self.me);
        if word.load(Ordering::Relaxed) != cpu {
            word.store(cpu, Ordering::Relaxed);
        }
    }
    /// The turn of `rank`'s latest post, if any (its slots' sequence words are turn + 1).
    fn last_posted(&self, rank: u32) -> Option<u64> {
        (0..TURNS).map(|t| self.seq(rank, t).load(Ordering::Relaxed)).max().and_then(|s| s.checked_sub(1))
    }
    fn slot(&self, rank: u32, turn: u64) -> usize {
        LINE + self.n as usize * LINE + (rank as usize * TURNS as usize + (turn % TURNS) as usize) * SLOT
    }
    fn seq(&self, rank: u32, turn: u64) -> &AtomicU64 {
        self.word64(self.slot(rank, turn))
    }
    /// Turn + 1 of the last turn with `turn`'s slot index that `rank` has folded (0: none).
    fn folded(&self, rank: u32, turn: u64) -> &AtomicU64 {
        self.word64(LINE + rank as usize * LINE + 8 + (turn % TURNS) as usize * 8)
    }
    fn payload(&self, rank: u32, turn: u64, len: usize) -> *mut u8 {
        let at = if len <= INLINE { INLINE_AT } else { LINE };
        self.at(self.slot(rank, turn) + at)
    }
    fn fingerprint(&self, rank: u32, turn: u64) -> *mut u8 {
        self.at(self.slot(rank, turn) + FP_AT)
    }

    fn wake(&self) {
        if self.sleepers().load(Ordering::SeqCst) > 0 {
            self.futex().fetch_add(1, Ordering::SeqCst);
            futex_wake(self.futex());
        }
    }

    /// Waits for `ready`. Where ranks share cores, yielding hands the core to a rank that may
    /// need it, but costs a context switch: while `needs_core(my core)` says that no rank this
    /// one waits for last ran on its core (they run elsewhere), it spins a while instead.
    fn wait_until(
        &self,
        ready: &dyn Fn() -> bool,
        needs_core: &dyn Fn(u32) -> bool,
        waited: &dyn Fn(u32) -> bool,
        late: &dyn Fn() -> String,
        watch: &mut Watch<'_>,
    ) -> Result<()> {
        if ready() {
            return Ok(());
        }
        let mut backoff = Backoff::learning(self.wait);
        let mut spins = 0;
        // Only waiters that share cores look at where the others run.
        let cpu_aware = self.wait.shares_cores();
        let mut mine = u32::MAX;
        if cpu_aware {
            mine = here();
            self.publish_cpu(mine);
        }
        let mut looks = 0u32;
        loop {
            if ready() {
                return Ok(());
            }
            // Health every few looks: between two looks the post may land, and a look that
            // does more notices it later (a 4-byte allreduce is a few such looks long).
            looks = looks.wrapping_add(1);
            if looks % HEALTH_EVERY == 1 {
                let health = (watch.quick)().and_then(|()| (watch.left)(waited).map_or(Ok(()), Err));
                if let Err(e) = health {
                    // A peer that posted and then left (or died) still counts: its post is there.
                    return if ready() { Ok(()) } else { Err(e) };
                }
            }
            if cpu_aware && spins < SPIN_LOOKS && !needs_core(mine) {
                spins += 1;
                for _ in 0..16 {
                    std::hint::spin_loop();
                }
                continue;
            }
            let slept = backoff.step();
            if cpu_aware {
                mine = here();
                self.publish_cpu(mine);
                if let Some(to) = self.spread(mine) {
                    mine = to;
                }
            }
            if slept {
                (watch.stalled)(waited, late)?;
                let seen = self.futex().load(Ordering::SeqCst);
                self.sleepers().fetch_add(1, Ordering::SeqCst);
                if !ready() {
                    futex_wait(self.futex(), seen, NAP);
                }
                self.sleepers().fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Now and then, moves this rank off a crowded core (see placement.rs). Returns the core
    /// it moved to.
    fn spread(&self, mine: u32) -> Option<u32> {
        if !self.spread_in.due() {
            return None;
        }
        let to =
            placement::spread(self.me, mine, &|f| (0..self.n).for_each(|r| f(r, self.cpu(r).load(Ordering::Relaxed))))?;
        self.spread_in.after_move();
        self.publish_cpu(to);
        Some(to)
    }

    /// Whether `rank` has folded the turn before `turn` with its slot index (`before` - 1), asking
    /// the board only when what this process saw last says no.
    fn has_folded(&self, rank: u32, turn: u64, before: u64) -> bool {
        let row = rank as usize * TURNS as usize;
        let known = &self.known[row + (turn % TURNS) as usize];
        if known.load(Ordering::Acquire) >= before {
            return true;
        }
        // One line holds all of the rank's words: take them all. Two threads refreshing at once
        // may store an older value over a newer one; it is still true, and costs a later look.
        for (t, k) in self.known[row..row + TURNS as usize].iter().enumerate() {
            k.store(self.folded(rank, t as u64).load(Ordering::Acquire), Ordering::Release);
        }
        known.load(Ordering::Acquire) >= before
    }

    /// Posts this rank's `data` of the call `fp` for board operation `turn`, once every rank has
    /// folded what its slot held `TURNS` turns ago.
    pub fn post(&self, turn: u64, data: &[u8], fp: &Fingerprint, watch: &mut Watch<'_>) -> Result<()> {
        if data.len() > BOARD_BYTES {
            return Err(Error::internal(format!(
                "a small collective of {} bytes does not fit its shared memory",
                data.len()
            )));
        }
        let me = self.me;
        let before = turn.checked_sub(TURNS).map_or(0, |t| t + 1);
        // No rank folds turn T + TURNS before every rank has folded T, so `folded` cannot have
        // passed `before` here.
        let all_folded = || (0..self.n).all(|r| self.has_folded(r, turn, before));
        let free = || self.seq(me, turn).load(Ordering::Acquire) == before && (before == 0 || all_folded());
        let behind = |r: u32| self.folded(r, turn).load(Ordering::Relaxed) < before;
        // This rank is TURNS small collectives ahead of the ranks that have not finished the
        // one that used this memory before.
        let late = || {
            let behind: Vec<u32> =
                (0..self.n).filter(|&r| self.folded(r, turn).load(Ordering::Relaxed) < before).collect();
            format!("ranks {behind:?} have not finished the small collective made {TURNS} calls before this one")
        };
        self.wait_until(&free, &|_| true, &behind, &late, watch)?;
        // SAFETY: the slot is ours: every rank has read its previous turn and none reads it
        // again before the sequence word below says so; the payload fits (checked above), and
        // the fingerprint has its own bytes in the sequence word's line.
        unsafe {
            std::ptr::copy_nonoverlapping(fp.encode().as_ptr(), self.fingerprint(me, turn), Fingerprint::BYTES);
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.payload(me, turn, data.len()), data.len());
        }
        self.seq(me, turn).store(turn + 1, Ordering::Release);
        // Every other rank reads these lines next: from the shared cache sooner than from ours.
        // A large post is read at the speed of the copy, and pushing it out costs the writer.
        let slot = self.slot(me, turn);
        demote(self.at(slot));
        if data.len() > INLINE {
            demote_small(self.at(slot + LINE), data.len());
        }
        self.wake();
        Ok(())
    }

    /// Reads every rank's post of `turn` in rank order, handing each to `each` (rank, its
    /// `len_of(rank)` bytes); an allreduce folds them all, a broadcast copies the root's (the
    /// same bits on every rank). Every post is waited for, whether or not its bytes are needed:
    /// a post of another call (its fingerprint differs from `fp`) is a mismatch that every rank
    /// finds, since every rank looks at every post; its bytes are never read. This rank's own
    /// post must be on the board.
    pub fn read(
        &self,
        turn: u64,
        fp: &Fingerprint,
        watch: &mut Watch<'_>,
        len_of: impl Fn(u32) -> usize,
        mut each: impl FnMut(u32, &[u8]),
    ) -> Result<()> {
        let r = self.read_posts(turn, fp, watch, len_of, &mut each);
        // Said for our own post too, and after a failure as well: a later turn of ours may run
        // on another stream and must not overwrite the slot before this read has seen it, and
        // a rank that gives up on a turn reads none of it any more.
        self.folded(self.me, turn).store(turn + 1, Ordering::Release);
        self.wake();
        r
    }

    fn read_posts(
        &self,
        turn: u64,
        fp: &Fingerprint,
        watch: &mut Watch<'_>,
        len_of: impl Fn(u32) -> usize,
        mut each: impl FnMut(u32, &[u8]),
    ) -> Result<()> {
        // Compared as bytes: decoded only to tell what differed.
        let mine = fp.encode();
        for rank in 0..self.n {
            if rank == self.me {
                // Posted by this very call, as the caller promises: neither waited for nor
                // compared.
                let len = len_of(rank).min(BOARD_BYTES);
                // SAFETY: our own slot of `turn`, which no rank writes before this rank has read it.
                each(rank, unsafe { std::slice::from_raw_parts(self.payload(rank, turn, len), len) });
                continue;
            }
            let seq = self.seq(rank, turn);
            // Ranks from `rank` on may not have posted yet; one that last ran on our core needs it.
            let needs_core = |mine: u32| {
                (rank..self.n).any(|r| {
                    r != self.me
                        && self.cpu(r).load(Ordering::Relaxed) == mine
                        && self.seq(r, turn).load(Ordering::Relaxed) != turn + 1
                })
            };
            let waited = |r: u32| r == rank;
            let late = || not_joined(rank, turn, self.last_posted(rank));
            self.wait_until(&|| seq.load(Ordering::Acquire) == turn + 1, &needs_core, &waited, &late, watch)?;
            let mut theirs = [0u8; Fingerprint::BYTES];
            // SAFETY: the writer published this slot for `turn` (Acquire above) and does not
            // touch it again until this rank says that it read the turn.
            unsafe { std::ptr::copy_nonoverlapping(self.fingerprint(rank, turn), theirs.as_mut_ptr(), theirs.len()) };
            if theirs != mine {
                return Err((watch.differs)(rank, &Fingerprint::decode(&theirs)));
            }
            // The same call posted exactly this many bytes; never more than a slot holds.
            let len = len_of(rank).min(BOARD_BYTES);
            // SAFETY: as above; `len` lies inside the slot.
            let post = unsafe { std::slice::from_raw_parts(self.payload(rank, turn, len), len) };
            each(rank, post);
        }
        Ok(())
    }
}
