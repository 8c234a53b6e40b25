//! The progress engine: one thread per process (`hccn-progress`) reads every TCP link's
//! frames, waiting in `epoll` on all their sockets at once, so that the threads of a rank do not
//! grow with the number of its peers. Each socket is armed for one readiness event at a time
//! (`EPOLLONESHOT`) and re-armed once served: a link whose receives take their own frames
//! (`TcpLink::poll`) is left unarmed meanwhile, as is one whose socket a receive is reading.
//! Reads never block (rx.rs), so a stalled peer holds up no other link.
//!
//! The thread lives while links do: the last link's end stops it.

use crate::sync::Locked;
use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::rx::{advance, finish, Conn, Step, Turn};
use crate::transport::waker::Waker;

/// How often the engine looks for links left aside whose receives stopped polling without
/// saying so (they took their frame): a control frame waits at most this long behind them.
/// Unit tests look far less often, so that a receive the engine never hears of fails instead
/// of being late.
#[cfg(not(test))]
const ASIDE_NAP: Duration = Duration::from_millis(20);
#[cfg(test)]
const ASIDE_NAP: Duration = Duration::from_secs(30);

/// The token of the waker in the epoll set (links count from 1).
const WAKER: u64 = 0;

/// What the engine thread and the links share.
struct Core {
    epoll: std::os::fd::OwnedFd,
    waker: Waker,
    stop: AtomicBool,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
    /// Some link may be left aside: the engine wakes for its tick (engine thread only).
    parked: AtomicBool,
}

/// The process's engine; links hold it, and the last one to go stops its thread.
pub(super) struct Engine {
    core: Arc<Core>,
    thread: Option<JoinHandle<()>>,
}

/// The engine, started with the first link that needs it; a forked child starts its own (its
/// parent's thread is not there, see fork.rs).
pub(super) fn engine() -> std::io::Result<Arc<Engine>> {
    static ENGINE: Mutex<(u64, Weak<Engine>)> = Mutex::new((0, Weak::new()));
    let generation = crate::fork::generation();
    let mut slot = ENGINE.locked();
    if let Some(e) = slot.1.upgrade().filter(|_| slot.0 == generation) {
        return Ok(e);
    }
    let e = Arc::new(Engine::start()?);
    // The parent's engine, if any, is only forgotten: its links hold it.
    *slot = (generation, Arc::downgrade(&e));
    Ok(e)
}

impl Engine {
    fn start() -> std::io::Result<Engine> {
        // SAFETY: epoll_create1 takes no pointers; a negative result is an error, checked below.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let epoll = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let core = Arc::new(Core {
            epoll,
            waker: Waker::new()?,
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next: AtomicU64::new(WAKER + 1),
            parked: AtomicBool::new(false),
        });
        core.ctl(libc::EPOLL_CTL_ADD, core.waker.fd(), libc::EPOLLIN as u32, WAKER)?;
        let run = core.clone();
        let thread = std::thread::Builder::new().name("hccn-progress".into()).spawn(move || run.run())?;
        Ok(Engine { core, thread: Some(thread) })
    }

    /// Starts watching `conn`'s socket; returns its token.
    pub fn add(&self, conn: &Arc<Conn>) -> std::io::Result<u64> {
        let token = self.core.next.fetch_add(1, Ordering::Relaxed);
        self.core.conns.locked().insert(token, conn.clone());
        let armed = self.core.ctl(libc::EPOLL_CTL_ADD, conn.fd, ONE_READ, token);
        if armed.is_err() {
            self.core.conns.locked().remove(&token);
        }
        armed.map(|()| token)
    }

    /// Stops watching the link of `token`; the engine may still be serving it (the caller waits
    /// for that under `reading`).
    pub fn remove(&self, token: u64, fd: std::os::fd::RawFd) {
        if self.core.conns.locked().remove(&token).is_some() {
            let _ = self.core.ctl(libc::EPOLL_CTL_DEL, fd, 0, token);
        }
    }

    /// Arms the socket of `token` for its next readiness event.
    pub fn arm(&self, token: u64, fd: std::os::fd::RawFd) {
        self.core.arm(token, fd);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.core.stop.store(true, Ordering::SeqCst);
        self.core.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Readable (or closed, or failed), reported once until re-armed.
const ONE_READ: u32 = (libc::EPOLLIN | libc::EPOLLONESHOT) as u32;

/// Events taken from the kernel per wait.
const BATCH: usize = 64;

impl Core {
    fn ctl(&self, op: libc::c_int, fd: std::os::fd::RawFd, events: u32, token: u64) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: a live epoll descriptor and event; the caller keeps `fd` open.
        match unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    }

    fn arm(&self, token: u64, fd: std::os::fd::RawFd) {
        // A link removed meanwhile is no longer in the set: nothing to arm.
        let _ = self.ctl(libc::EPOLL_CTL_MOD, fd, ONE_READ, token);
    }

    /// Waits up to `timeout` (`None`: until something happens) and serves what became
    /// readable; true when a data frame was filed.
    fn turn(&self, events: &mut [libc::epoll_event; BATCH], timeout: Option<Duration>) -> bool {
        use std::os::fd::AsRawFd;
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        // SAFETY: `events` is a live array of BATCH entries.
        let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), events.as_mut_ptr(), BATCH as i32, ms) };
        let mut data = false;
        for ev in events.iter().take(n.max(0) as usize) {
            let token = ev.u64;
            if token == WAKER {
                self.waker.clear();
                continue;
            }
            let conn = self.conns.locked().get(&token).cloned();
            if let Some(c) = conn {
                data |= self.serve(token, &c);
            }
        }
        data
    }

    /// Reads what `c`'s socket holds, unless receives take it themselves; re-arms the socket
    /// unless the link is left aside, busy or over. True when a data frame was filed.
    fn serve(&self, token: u64, c: &Conn) -> bool {
        let mut rx = match c.reading.try_lock() {
            Ok(rx) => rx,
            Err(_) => {
                // A receive reads the socket: it re-arms it when it lets go (`TcpLink::let_go`).
                c.busy.store(true, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                match c.reading.try_lock() {
                    Ok(rx) if c.busy.swap(false, Ordering::SeqCst) => rx,
                    // Let go already, and re-armed by the receive.
                    _ => return false,
                }
            }
        };
        if c.closing.load(Ordering::SeqCst) || rx.done {
            return false;
        }
        let step = advance(c, &mut rx, Turn::Engine);
        match step {
            Step::Drained { data } | Step::More { data } => {
                self.arm(token, c.fd);
                data
            }
            Step::Aside { data } => {
                self.parked.store(true, Ordering::Relaxed);
                c.aside.store(true, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                // The receives may have stopped polling before they could see `aside`.
                if c.polled.load(Ordering::SeqCst) == 0 && c.aside.swap(false, Ordering::SeqCst) {
                    self.arm(token, c.fd);
                }
                data
            }
            Step::Over(end) => {
                finish(c, &mut rx, end);
                drop(rx);
                if self.conns.locked().remove(&token).is_some() {
                    let _ = self.ctl(libc::EPOLL_CTL_DEL, c.fd, 0, token);
                }
                false
            }
        }
    }

    /// Re-arms the links left aside whose receives no longer poll; notes whether any is still
    /// aside.
    fn tick(&self) {
        let conns: Vec<(u64, Arc<Conn>)> = self.conns.locked().iter().map(|(t, c)| (*t, c.clone())).collect();
        let mut parked = false;
        for (token, c) in conns {
            if c.polled.load(Ordering::SeqCst) == 0 && c.aside.swap(false, Ordering::SeqCst) {
                self.arm(token, c.fd);
            }
            parked |= c.aside.load(Ordering::SeqCst);
        }
        self.parked.store(parked, Ordering::Relaxed);
    }

    fn run(&self) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; BATCH];
        let mut last_tick = Instant::now();
        // Until when the engine looks for more frames without sleeping.
        let mut spin_until: Option<Instant> = None;
        while !self.stop.load(Ordering::SeqCst) {
            let spinning = spin_until.is_some_and(|t| Instant::now() < t);
            let parked = self.parked.load(Ordering::Relaxed);
            let wait = match (spinning, parked) {
                (true, _) => Some(Duration::ZERO),
                // Without links aside, nothing is due until a socket or the waker speaks.
                (false, false) => None,
                (false, true) => Some(ASIDE_NAP.saturating_sub(last_tick.elapsed())),
            };
            // Frames of an operation follow each other closely: after a data frame, look for
            // the next one a while before sleeping (see TCP_POLL), but not after heartbeats or
            // control frames alone, where the look would only take time from the ranks sharing
            // our cores.
            if self.turn(&mut events, wait) {
                spin_until = Some(Instant::now() + crate::transport::TCP_POLL);
            } else if spinning {
                std::thread::yield_now();
            }
            // Links aside are looked at every ASIDE_NAP even while traffic keeps the engine
            // awake.
            if !self.parked.load(Ordering::Relaxed) {
                last_tick = Instant::now();
            } else if last_tick.elapsed() >= ASIDE_NAP {
                last_tick = Instant::now();
                self.tick();
            }
        }
    }
}
