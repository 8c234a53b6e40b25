//! Board allreduce for the smallest buffers on a communicator whose ranks all share one host:
//! each rank posts its buffer on the communicator's shared-memory board and folds every post
//! itself, in rank order (see transport/shm_board.rs). One round of waiting, no messages; with more
//! ranks than cores that saves the context switches that each extra round costs.
//!
//! Whether an allreduce goes to the board is decided when it is submitted, from what every
//! rank shares (the host layout, HCCN_TRANSPORT, HCCN_ALGO, the size), and board operations are
//! numbered then ("turns"), so that every rank gives the same operation the same slot even when
//! streams run them in another order. The board itself is made by the first board operation:
//! rank 0 creates the file and names it, every rank maps it and says so, rank 0 unlinks it and
//! announces whether all succeeded. If not, every board operation of the communicator runs
//! recursive doubling instead; all ranks know the same verdict.

use crate::sync::{Locked, Waits};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Instant;

use super::rhd::RD;
use super::{fingerprint, Algorithm, Ctx, ReduceArgs, Work};
use crate::error::{Error, Result};
use crate::transport::shm_board::{Board, Watch, BOARD_BYTES, BOARD_RANKS};
use crate::wire::Fingerprint;

pub(crate) struct BoardAllreduce;

/// Tags of the set-up messages, far from those of the algorithms (small step numbers).
const TAG_NAME: u32 = 0x4000_0000;
const TAG_MAPPED: u32 = TAG_NAME + 1;
const TAG_VERDICT: u32 = TAG_NAME + 2;
/// Bytes of the name message: its length, then the path.
const NAME_MSG: usize = 128;

/// A communicator's board: whether it may have one, the turn counter, the board once made.
pub(crate) struct BoardCell {
    usable: bool,
    /// HCCN_BOARD_BYTES.
    max_bytes: usize,
    turns: AtomicU64,
    /// The board once turn 0 made it: read without a lock by every later operation (a lock or
    /// a reference count taken per operation waits for the post's store to reach the other
    /// cores, a fifth of a 4-byte allreduce).
    board: OnceLock<Board>,
    /// Whether turn 0 has decided (with or without a board); `decided` wakes its waiters.
    setup_done: Mutex<bool>,
    decided: Condvar,
}

impl BoardCell {
    /// `shared_host`: every member is on this host (from the layout all members share);
    /// `shm`: HCCN_TRANSPORT allows shared memory; `auto`: HCCN_ALGO leaves the choice open;
    /// `max_bytes`: HCCN_BOARD_BYTES. All are the same on every member.
    pub fn new(n: u32, shared_host: bool, shm: bool, auto: bool, max_bytes: usize) -> BoardCell {
        BoardCell {
            max_bytes: max_bytes.min(BOARD_BYTES),
            usable: shared_host && shm && auto && (2..=BOARD_RANKS).contains(&n),
            turns: AtomicU64::new(0),
            board: OnceLock::new(),
            setup_done: Mutex::new(false),
            decided: Condvar::new(),
        }
    }

    /// Whether an allreduce of `bytes` goes to the board (the same answer on every rank).
    pub fn takes(&self, bytes: usize) -> bool {
        self.usable && bytes > 0 && bytes <= self.max_bytes
    }

    /// Whether the call `fp` goes to the board on this communicator (what `turn_for` decides).
    pub fn goes(&self, fp: &Fingerprint) -> bool {
        match fingerprint::allreduce_bytes(fp) {
            Some(0) => self.usable,
            Some(bytes) => self.takes(bytes),
            None => false,
        }
    }

    /// The turn of `work` when it goes to the board (`empty_allreduce`: an allreduce of 0
    /// elements, which posts nothing but its fingerprint); call once per operation, in submit
    /// order.
    pub fn turn_for(&self, work: &Work, empty_allreduce: bool) -> Option<u64> {
        let goes = match work {
            Work::Reduce { root: None, bytes, .. } => self.takes(*bytes),
            Work::Nothing => empty_allreduce && self.usable,
            _ => false,
        };
        goes.then(|| self.turns.fetch_add(1, Ordering::SeqCst))
    }

    /// False once the set-up failed: the board operations run recursive doubling.
    pub fn is_on(&self) -> bool {
        self.board.get().is_some() || !*self.setup_done.locked()
    }

    fn decide(&self, board: Option<Board>) -> Option<&Board> {
        if let Some(b) = board {
            // Only turn 0 decides, once.
            let _ = self.board.set(b);
        }
        *self.setup_done.locked() = true;
        self.decided.notify_all();
        self.board.get()
    }

    /// The board for operation `turn`: turn 0 makes it, later turns wait for the verdict.
    fn get(&self, ctx: &Ctx<'_>, turn: u64) -> Result<Option<&Board>> {
        if let Some(b) = self.board.get() {
            return Ok(Some(b));
        }
        if turn == 0 {
            return match make(ctx) {
                Ok(b) => Ok(self.decide(b)),
                Err(e) => {
                    self.decide(None);
                    Err(e)
                }
            };
        }
        let deadline = Instant::now() + ctx.timeout();
        let mut s = self.setup_done.locked();
        loop {
            if *s {
                return Ok(self.board.get());
            }
            // Turn 0 was submitted before this one, on this rank: it runs or is queued.
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::timeout("the communicator's first small allreduce never ran (HCCN_TIMEOUT_MS)"));
            }
            s = self.decided.wait_locked_for(s, left);
        }
    }
}

/// Makes the board (run by every rank in the communicator's first board operation).
fn make(ctx: &Ctx<'_>) -> Result<Option<Board>> {
    let (n, me) = (ctx.size(), ctx.rank());
    if me != 0 {
        let msg = ctx.recv(0, TAG_NAME, NAME_MSG)?;
        let len = usize::from(msg[0]).min(NAME_MSG - 1);
        let path = String::from_utf8_lossy(&msg[1..1 + len]).into_owned();
        let board = (len > 0)
            .then(|| ctx.net().open_board(&path, n, me))
            .transpose()
            .map_err(|e| tracing::warn!("no shared-memory board ({path}: {e}); small allreduces use messages"))
            .ok()
            .flatten();
        ctx.send(0, TAG_MAPPED, &[board.is_some() as u8])?;
        let verdict = ctx.recv(0, TAG_VERDICT, 1)?;
        return Ok(board.filter(|_| verdict[0] == 1));
    }
    let (id, epoch) = ctx.comm_id();
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let path = format!("/dev/shm/hccn-board-{}-{id:016x}-{epoch}-{nonce:08x}", std::process::id());
    let board = ctx
        .net()
        .create_board(&path, n, me)
        .map_err(|e| tracing::warn!("no shared-memory board ({path}: {e}); small allreduces use messages"))
        .ok();
    let mut msg = [0u8; NAME_MSG];
    if board.is_some() {
        msg[0] = path.len() as u8;
        msg[1..1 + path.len()].copy_from_slice(path.as_bytes());
    }
    let mut all = board.is_some();
    let sent = (1..n).try_for_each(|r| ctx.send(r, TAG_NAME, &msg)).and_then(|_| {
        for r in 1..n {
            all &= ctx.recv(r, TAG_MAPPED, 1)?[0] == 1;
        }
        Ok(())
    });
    // Mapped everywhere it will be (or never will be): the name is no longer needed.
    if board.is_some() {
        let _ = std::fs::remove_file(&path);
    }
    sent?;
    (1..n).try_for_each(|r| ctx.send(r, TAG_VERDICT, &[all as u8]))?;
    Ok(board.filter(|_| all))
}

impl Algorithm for BoardAllreduce {
    fn name(&self) -> &'static str {
        "board"
    }

    fn reduce(&self, ctx: &Ctx<'_>, w: &mut ReduceArgs<'_>) -> Result<()> {
        let board = match ctx.turn() {
            Some(turn) if w.root.is_none() => ctx.board_cell().get(ctx, turn)?.map(|b| (b, turn)),
            _ => None,
        };
        let Some((board, turn)) = board else { return RD.reduce(ctx, w) };
        // Taken at the first stall: most operations never stall, and need no clock.
        let mut deadline = None;
        let mut quick = || ctx.health_error().map_or(Ok(()), Err);
        let mut stalled = || {
            ctx.net().keep_moving();
            if let Some(e) = ctx.message_for_board_turn() {
                return Err(e);
            }
            if Instant::now() >= *deadline.get_or_insert_with(|| Instant::now() + ctx.timeout()) {
                return Err(Error::timeout(format!(
                    "a small allreduce waited {} ms for the other ranks on this host (HCCN_TIMEOUT_MS)",
                    ctx.timeout().as_millis()
                )));
            }
            Ok(())
        };
        let left = |waited: &dyn Fn(u32) -> bool| ctx.departed_among(waited);
        let fp = ctx.fingerprint();
        let differs = |rank: u32, theirs: &Fingerprint| fingerprint::mismatch(&fp, ctx.rank(), theirs, rank);
        let mut watch = Watch { quick: &mut quick, stalled: &mut stalled, left: &left, differs: &differs };
        board.post(turn, w.acc, &fp, &mut watch)?;
        board.fold(turn, w.acc, w.dt, w.op, &fp, &mut watch)
    }
}
