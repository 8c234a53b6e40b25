//! Board collectives for the smallest calls on a communicator whose ranks all share one host:
//! each rank posts its bytes on the communicator's shared-memory board once and reads, in rank
//! order, what it needs from every post (see transport/shm_board.rs): an allreduce folds all
//! posts, an allgather copies them, a broadcast takes the root's, an alltoall takes its block of
//! each. One round of waiting, no messages; with more ranks than cores that saves the context
//! switches that each extra round costs. Every rank waits for every post, the root of a broadcast
//! too, and checks its fingerprint: a call that differs anywhere is found by every rank.
//!
//! Whether a call goes to the board is decided when it is submitted, from what every rank
//! shares (the host layout, HCCN_TRANSPORT, HCCN_ALGO, HCCN_BOARD_BYTES and the call's
//! fingerprint), and board calls are numbered then ("turns"), so that every rank gives the same
//! call the same slot even when streams run them in another order. The board itself is made by
//! the first board call: rank 0 creates the file and names it, every rank maps it and says so,
//! rank 0 unlinks it and announces whether all succeeded (all along rank 0's binomial tree). If
//! not, every board call of the communicator goes to the message algorithms instead; all ranks
//! know the same verdict.

use crate::sync::{Locked, Waits};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Instant;

use super::{fingerprint, Algorithm, AllToAllArgs, Ctx, GatherArgs, ReduceArgs, ReduceScatterArgs, ScatterArgs};
use crate::error::{Error, Result};
use crate::reduce;
use crate::transport::shm_board::{Board, Watch, BOARD_BYTES, BOARD_RANKS};
use crate::types::{DataType, ReduceOp};
use crate::wire::Fingerprint;

/// The algorithm of every call that goes to the board.
pub(crate) struct BoardCollectives;

/// Tags of the set-up messages, far from those of the algorithms (small step numbers).
const TAG_NAME: u32 = 0x4000_0000;
const TAG_MAPPED: u32 = TAG_NAME + 1;
const TAG_VERDICT: u32 = TAG_NAME + 2;
/// Bytes of the name message: its length, then the path.
const NAME_MSG: usize = 128;

/// A communicator's board: whether it may have one, the turn counter, the board once made.
pub(crate) struct BoardCell {
    n: u32,
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
            n,
            max_bytes: max_bytes.min(BOARD_BYTES),
            usable: shared_host && shm && auto && max_bytes > 0 && (2..=BOARD_RANKS).contains(&n),
            turns: AtomicU64::new(0),
            board: OnceLock::new(),
            setup_done: Mutex::new(false),
            decided: Condvar::new(),
        }
    }

    /// Whether a call whose largest post is `post_bytes` goes to the board.
    fn takes(&self, post_bytes: usize) -> bool {
        self.usable && post_bytes <= self.max_bytes
    }

    /// Whether the call `fp` goes to the board on this communicator (the same answer on every
    /// rank that made the same call). A call of nothing goes too: its post is its fingerprint.
    pub fn goes(&self, fp: &Fingerprint) -> bool {
        fingerprint::board_post(fp, self.n).is_some_and(|bytes| self.takes(bytes))
    }

    /// Whether the collective `op` (an `Op::name`) over `bytes` (the whole buffer, as
    /// `select::plan_name` reads it) would go to the board, for tools.
    pub fn would_take(&self, op: &str, bytes: usize) -> bool {
        fingerprint::for_plan(op, bytes, self.n).is_some_and(|fp| self.goes(&fp)) && self.is_on()
    }

    /// The turn of the call `fp` when it goes to the board; call once per collective, in
    /// submit order.
    pub fn turn_for(&self, fp: &Fingerprint) -> Option<u64> {
        self.goes(fp).then(|| self.turns.fetch_add(1, Ordering::SeqCst))
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

    /// The board once made (every board call after [`settle`]).
    fn made(&self) -> Option<&Board> {
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
                return Err(Error::timeout("the communicator's first small collective never ran (HCCN_TIMEOUT_MS)"));
            }
            s = self.decided.wait_locked_for(s, left);
        }
    }
}

/// Makes the board (run by every rank in the communicator's first board operation). The name,
/// whether every rank mapped it and the verdict travel along rank 0's binomial tree, whose
/// links a world that connects on demand forms with: a star from rank 0 would link it with
/// every rank of the host.
fn make(ctx: &Ctx<'_>) -> Result<Option<Board>> {
    let (n, me) = (ctx.size(), ctx.rank());
    let (parent, children) = super::tree::family(me, 0, n);
    let (board, name) = match parent {
        None => create(ctx),
        Some(p) => {
            let mut name = [0u8; NAME_MSG];
            let msg = ctx.recv(p, TAG_NAME, NAME_MSG)?;
            let got = msg.len().min(NAME_MSG);
            name[..got].copy_from_slice(&msg[..got]);
            let board = path_in(&name).and_then(|path| {
                ctx.net()
                    .open_board(&path, n, me)
                    .map_err(|e| {
                        crate::transport::fell_back(
                            &format!("the shared memory of small collectives ({path})"),
                            &e,
                            "small collectives use messages",
                        )
                    })
                    .ok()
            });
            (board, name)
        }
    };
    let below = (|| -> Result<bool> {
        let mut all = board.is_some();
        children.iter().try_for_each(|&c| ctx.send(c, TAG_NAME, &name))?;
        for &c in &children {
            all &= ctx.recv(c, TAG_MAPPED, 1)?[0] == 1;
        }
        Ok(all)
    })();
    let verdict = match parent {
        None => {
            // Mapped everywhere it will be (or never will be): the name is no longer needed.
            if let Some(path) = path_in(&name) {
                let _ = std::fs::remove_file(path);
            }
            below?
        }
        Some(p) => {
            ctx.send(p, TAG_MAPPED, &[below? as u8])?;
            ctx.recv(p, TAG_VERDICT, 1)?[0] == 1
        }
    };
    children.iter().try_for_each(|&c| ctx.send(c, TAG_VERDICT, &[verdict as u8]))?;
    Ok(board.filter(|_| verdict))
}

/// The path a name message carries (its length, then the path), if any.
fn path_in(name: &[u8; NAME_MSG]) -> Option<String> {
    let len = usize::from(name[0]).min(NAME_MSG - 1);
    (len > 0).then(|| String::from_utf8_lossy(&name[1..1 + len]).into_owned())
}

/// Rank 0's part: creates the board's file; returns it and the name message (an empty name when
/// there is no board).
fn create(ctx: &Ctx<'_>) -> (Option<Board>, [u8; NAME_MSG]) {
    let (id, epoch) = ctx.comm_id();
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let path = format!("/dev/shm/hccn-board-{}-{id:016x}-{epoch}-{nonce:08x}", std::process::id());
    let board = ctx
        .net()
        .create_board(&path, ctx.size(), ctx.rank())
        .map_err(|e| {
            crate::transport::fell_back(
                &format!("the shared memory of small collectives ({path})"),
                &e,
                "small collectives use messages",
            )
        })
        .ok();
    let mut msg = [0u8; NAME_MSG];
    if board.is_some() {
        msg[0] = path.len() as u8;
        msg[1..1 + path.len()].copy_from_slice(path.as_bytes());
    }
    (board, msg)
}

/// The context `ctx` runs with: its own when its call has no board turn or the board is there,
/// without the turn when the communicator has no board (its set-up failed on some rank, then it
/// failed on every rank alike): the call runs the message algorithms.
pub(crate) fn settle<'a>(ctx: &Ctx<'a>) -> Result<Ctx<'a>> {
    match ctx.turn() {
        Some(turn) if ctx.board_cell().get(ctx, turn)?.is_none() => Ok(ctx.without_turn()),
        _ => Ok(*ctx),
    }
}

/// Whether [`settle`] may change `ctx`: only until the board is made (or found impossible).
#[inline]
pub(crate) fn unsettled(ctx: &Ctx<'_>) -> bool {
    ctx.turn().is_some() && ctx.board_cell().made().is_none()
}

/// What a rank posts: bytes of its own, or a range of the buffer its reads fill (in place).
enum Post<'p> {
    Bytes(&'p [u8]),
    Out(Range<usize>),
}

/// Runs one board call: posts `post`, then hands every rank's post (`len_of(rank)` bytes) to
/// `each` with `out`, in rank order.
fn on_board(
    ctx: &Ctx<'_>,
    post: Post<'_>,
    out: &mut [u8],
    len_of: impl Fn(u32) -> usize,
    mut each: impl FnMut(u32, &[u8], &mut [u8]),
) -> Result<()> {
    let (Some(turn), Some(board)) = (ctx.turn(), ctx.board_cell().made()) else {
        return Err(Error::internal("a small collective ran on shared memory that was never set up"));
    };
    // Taken at the first stall: most calls never stall, and need no clock.
    let mut since = None;
    let mut warned = false;
    let mut quick = || ctx.health_error().map_or(Ok(()), Err);
    let mut stalled = |waits_for: &dyn Fn(u32) -> bool, late: &dyn Fn() -> String| {
        ctx.net().keep_moving();
        if let Some(e) = ctx.message_for_board_turn() {
            return Err(e);
        }
        let waited = since.get_or_insert_with(Instant::now).elapsed();
        if waited >= ctx.timeout() {
            if let Some(e) = (0..ctx.size()).filter(|&r| waits_for(r)).find_map(|r| ctx.send_instead(r)) {
                return Err(e);
            }
            return Err(Error::timeout(format!(
                "{}; waited {} ms for it (HCCN_TIMEOUT_MS)",
                late(),
                ctx.timeout().as_millis()
            )));
        }
        if !warned && waited >= late_warning_after(ctx.timeout()) {
            warned = true;
            tracing::warn!(
                "call {} on this communicator has waited {} ms: {}; it fails at {} ms (HCCN_TIMEOUT_MS)",
                ctx.seq(),
                waited.as_millis(),
                late(),
                ctx.timeout().as_millis()
            );
        }
        Ok(())
    };
    let left = |waited: &dyn Fn(u32) -> bool| ctx.departed_among(waited);
    let fp = ctx.fingerprint();
    let differs = |rank: u32, theirs: &Fingerprint| fingerprint::mismatch(fp, ctx.rank(), theirs, rank);
    let mut watch = Watch { quick: &mut quick, stalled: &mut stalled, left: &left, differs: &differs };
    let bytes = match post {
        Post::Bytes(b) => b,
        Post::Out(range) => &out[range],
    };
    board.post(turn, bytes, fp, &mut watch)?;
    board.read(turn, fp, &mut watch, len_of, |rank, post| each(rank, post, out))
}

/// How long a board call waits for a late rank before it warns, naming it: half the deadline,
/// at most 10 s (README, HCCN_TIMEOUT_MS).
fn late_warning_after(timeout: std::time::Duration) -> std::time::Duration {
    (timeout / 2).min(std::time::Duration::from_secs(10))
}

/// Folds `range` of every post in rank order into the output (the same bits on every rank).
fn fold(range: Range<usize>, dt: DataType, op: ReduceOp) -> impl FnMut(u32, &[u8], &mut [u8]) {
    move |rank, post, acc| {
        let part = &post[range.clone()];
        if rank == 0 {
            acc.copy_from_slice(part);
        } else {
            reduce::reduce_into(acc, part, dt, op);
        }
    }
}

/// Reads nothing: a rank that only checks the other calls (and lets the others read its post).
fn nothing(_: u32, _: &[u8], _: &mut [u8]) {}

impl Algorithm for BoardCollectives {
    fn name(&self) -> &'static str {
        "board"
    }

    /// In place: the post is `acc` itself, copied to the board before the fold overwrites it.
    fn reduce(&self, ctx: &Ctx<'_>, w: &mut ReduceArgs<'_>) -> Result<()> {
        let len = w.acc.len();
        if w.root.is_some_and(|root| root != ctx.rank()) {
            return on_board(ctx, Post::Out(0..len), w.acc, |_| 0, &mut nothing);
        }
        on_board(ctx, Post::Out(0..len), w.acc, |_| len, &mut fold(0..len, w.dt, w.op))
    }

    fn allreduce_from(&self, ctx: &Ctx<'_>, input: &[u8], w: &mut ReduceArgs<'_>) -> Result<()> {
        let len = input.len();
        on_board(ctx, Post::Bytes(input), w.acc, |_| len, &mut fold(0..len, w.dt, w.op))
    }

    fn reduce_from(
        &self,
        ctx: &Ctx<'_>,
        input: &[u8],
        out: Option<&mut [u8]>,
        dt: DataType,
        op: ReduceOp,
        root: u32,
    ) -> Result<()> {
        let len = input.len();
        match out.filter(|_| root == ctx.rank()) {
            Some(out) => on_board(ctx, Post::Bytes(input), out, |_| len, &mut fold(0..len, dt, op)),
            None => on_board(ctx, Post::Bytes(input), &mut [], |_| 0, &mut nothing),
        }
    }

    fn broadcast(&self, ctx: &Ctx<'_>, buf: &mut [u8], root: u32) -> Result<()> {
        let len = buf.len();
        let len_of = |r: u32| if r == root { len } else { 0 };
        if root == ctx.rank() {
            return on_board(ctx, Post::Out(0..len), buf, len_of, &mut nothing);
        }
        let mut take = |r: u32, post: &[u8], out: &mut [u8]| {
            if r == root {
                out.copy_from_slice(post);
            }
        };
        on_board(ctx, Post::Bytes(&[]), buf, len_of, &mut take)
    }

    fn gather(&self, ctx: &Ctx<'_>, w: &mut GatherArgs<'_>) -> Result<()> {
        let me = ctx.rank();
        let blocks = w.blocks;
        let len_of = |r: u32| blocks[r as usize].len();
        if w.root.is_some_and(|root| root != me) {
            // A gather's non-root: posts its block, keeps nothing.
            return on_board(ctx, Post::Bytes(w.own), &mut [], len_of, &mut nothing);
        }
        // The own block is in place already: it is the post.
        let mut put = |r: u32, post: &[u8], out: &mut [u8]| {
            if r != me {
                out[blocks[r as usize].clone()].copy_from_slice(post);
            }
        };
        on_board(ctx, Post::Out(blocks[me as usize].clone()), w.recv, len_of, &mut put)
    }

    fn reduce_scatter(&self, ctx: &Ctx<'_>, w: &mut ReduceScatterArgs<'_>) -> Result<()> {
        let (total, block) = (w.input.len(), w.block_bytes);
        let mine = ctx.rank() as usize * block;
        on_board(ctx, Post::Bytes(w.input), w.out, |_| total, &mut fold(mine..mine + block, w.dt, w.op))
    }

    fn scatter(&self, ctx: &Ctx<'_>, w: &mut ScatterArgs<'_>) -> Result<()> {
        let (root, blocks) = (w.root, w.blocks);
        let span = super::span(blocks);
        let len_of = |r: u32| if r == root { span } else { 0 };
        let mine = blocks[ctx.rank() as usize].clone();
        // A root in place (`out` empty) has its block where it belongs already.
        let mut take = |r: u32, post: &[u8], out: &mut [u8]| {
            if r == root && !out.is_empty() {
                out.copy_from_slice(&post[mine.clone()]);
            }
        };
        on_board(ctx, Post::Bytes(w.send), w.recv, len_of, &mut take)
    }

    /// Only alltoall with one count for all goes to the board: rank r's block for this rank
    /// lies where this rank's own block for itself lies.
    fn all_to_all(&self, ctx: &Ctx<'_>, w: &mut AllToAllArgs<'_>) -> Result<()> {
        let total = w.send.len();
        let mine = w.send_blocks[ctx.rank() as usize].clone();
        let recv_blocks = w.recv_blocks;
        let mut put = |r: u32, post: &[u8], out: &mut [u8]| {
            out[recv_blocks[r as usize].clone()].copy_from_slice(&post[mine.clone()]);
        };
        on_board(ctx, Post::Bytes(w.send), w.recv, |_| total, &mut put)
    }

    fn barrier(&self, ctx: &Ctx<'_>) -> Result<()> {
        on_board(ctx, Post::Bytes(&[]), &mut [], |_| 0, &mut nothing)
    }
}
