//! Per-rank trace recorder: with `HCCN_TRACE=DIR`, every operation and every transfer becomes a
//! Chrome trace-event ("ph":"X") in `DIR/hccn-trace-<job>-<rank>.json`, loadable by Perfetto and
//! chrome://tracing (format in docs/observability.md).
//!
//! Off, recording costs one load of an initialised `OnceLock` and a branch. On, events go to an
//! in-memory list capped at [`MAX_EVENTS`] (later ones are only counted), and the file is
//! rewritten whole by [`flush`]: at process exit (an `atexit` hook installed with the recorder),
//! when an operation fails, and whenever the program calls it.

use crate::sync::Locked;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use crate::config::Config;

/// Events kept per process; beyond this they are counted as dropped, so memory stays bounded.
pub const MAX_EVENTS: usize = 1_000_000;

/// What one event describes.
#[derive(Debug, Clone)]
enum Kind {
    Op(OpInfo),
    /// `peer` is a communicator rank, `world` the same peer's world rank.
    Transfer {
        peer: u32,
        world: u32,
        bytes: u64,
        send: bool,
    },
    /// The link to world rank `world` carried nothing while its pulses still came: a slow
    /// link, not a dead one (the event spans the slow stretch).
    Straggler {
        world: u32,
    },
}

/// The arguments of an operation event.
#[derive(Debug, Clone)]
pub(crate) struct OpInfo {
    pub name: &'static str,
    pub dtype: &'static str,
    pub count: u64,
    pub bytes: u64,
    pub algorithm: &'static str,
    pub comm: u64,
    pub epoch: u64,
    pub rank: u32,
    pub size: u32,
    /// The operation returned an error.
    pub failed: bool,
}

#[derive(Debug)]
struct Event {
    kind: Kind,
    /// Start and duration in ns since the recorder started.
    start_ns: u64,
    dur_ns: u64,
    tid: u32,
}

#[derive(Debug, Default)]
struct Events {
    list: Vec<Event>,
    dropped: u64,
    /// World rank of the first communicator that recorded anything: names the file.
    rank: Option<u32>,
}

#[derive(Debug)]
struct Recorder {
    dir: PathBuf,
    job: String,
    epoch: Instant,
    /// Wall-clock time of `epoch`, so that tools can line up the ranks' files.
    epoch_unix_us: u128,
    events: Mutex<Events>,
}

static RECORDER: OnceLock<Option<Recorder>> = OnceLock::new();

/// The recorder, started on first use from the environment; `None` when tracing is off.
fn recorder() -> Option<&'static Recorder> {
    RECORDER
        .get_or_init(|| {
            // An invalid environment fails communicator creation anyway; tracing just stays off.
            let cfg = Config::from_env().ok()?;
            let dir = cfg.trace?;
            // SAFETY: `flush_at_exit` is an `extern "C" fn()` that never unwinds.
            unsafe { libc::atexit(flush_at_exit) };
            Some(Recorder {
                dir,
                job: cfg.job_id.unwrap_or_else(|| "local".to_owned()),
                epoch: Instant::now(),
                epoch_unix_us: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros()),
                events: Mutex::new(Events::default()),
            })
        })
        .as_ref()
}

extern "C" fn flush_at_exit() {
    let _ = std::panic::catch_unwind(flush);
}

/// When a traced interval started; `None` (nothing to do) when tracing is off.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start(Option<Instant>);

pub(crate) fn start() -> Start {
    Start(recorder().map(|_| Instant::now()))
}

impl Start {
    pub fn is_on(self) -> bool {
        self.0.is_some()
    }
}

/// A small per-process number for the calling thread (the caller's thread, stream workers).
fn thread_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    thread_local!(static ID: u32 = NEXT.fetch_add(1, Ordering::Relaxed));
    ID.with(|id| *id)
}

fn push(start: Start, world_rank: u32, kind: Kind) {
    let (Some(rec), Some(t0)) = (recorder(), start.0) else { return };
    let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let event = Event {
        kind,
        start_ns: ns(t0.saturating_duration_since(rec.epoch)),
        dur_ns: ns(t0.elapsed()),
        tid: thread_id(),
    };
    let mut ev = rec.events.locked();
    ev.rank.get_or_insert(world_rank);
    if ev.list.len() < MAX_EVENTS {
        ev.list.push(event);
    } else {
        ev.dropped += 1;
    }
}

/// Records an operation that began at `start`.
pub(crate) fn op(start: Start, world_rank: u32, info: OpInfo) {
    push(start, world_rank, Kind::Op(info));
}

/// Records a send (`send`) or receive of `bytes` with communicator rank `peer` (world rank `world`).
pub(crate) fn transfer(start: Start, world_rank: u32, peer: u32, world: u32, bytes: u64, send: bool) {
    push(start, world_rank, Kind::Transfer { peer, world, bytes, send });
}

/// Records that the link to world rank `world` was slow (nothing on it, pulses still coming)
/// from `start` until now.
pub(crate) fn straggler(start: Start, world_rank: u32, world: u32) {
    push(start, world_rank, Kind::Straggler { world });
}

/// When a slow stretch began, given how long ago.
pub(crate) fn started_ago(ago: std::time::Duration) -> Start {
    Start(recorder().and_then(|_| Instant::now().checked_sub(ago)))
}

/// Writes this process's trace file now (all events so far, replacing an earlier flush). Does
/// nothing when tracing is off or nothing was recorded. Errors go to the log: a trace must never
/// fail the program.
pub fn flush() {
    let Some(rec) = recorder() else { return };
    let ev = rec.events.locked();
    if ev.list.is_empty() && ev.dropped == 0 {
        return;
    }
    let rank = ev.rank.unwrap_or_else(std::process::id);
    let path = rec.dir.join(format!("hccn-trace-{}-{rank}.json", sanitize(&rec.job)));
    let body = render(&ev, rank, &rec.job, rec.epoch_unix_us);
    drop(ev);
    if let Err(e) = write_atomically(&path, body.as_bytes()) {
        tracing::warn!("cannot write trace {}: {e}", path.display());
    }
}

fn write_atomically(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}.{}", std::process::id(), SERIAL.fetch_add(1, Ordering::Relaxed)));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    drop(f);
    std::fs::rename(&tmp, path)
}

/// A job name made safe for a file name.
fn sanitize(job: &str) -> String {
    job.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect()
}

/// The trace-event JSON: events sorted by thread, then start, so each thread reads in order.
fn render(ev: &Events, rank: u32, job: &str, epoch_unix_us: u128) -> String {
    let mut order: Vec<&Event> = ev.list.iter().collect();
    order.sort_by_key(|e| (e.tid, e.start_ns, std::cmp::Reverse(e.dur_ns)));
    let mut out = String::with_capacity(64 + order.len() * 200);
    out.push_str("{\"traceEvents\":[");
    for (i, e) in order.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('\n');
        render_event(&mut out, e, rank);
    }
    out.push_str(&format!(
        "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{{\"job\":{},\"rank\":{rank},\"dropped\":{},\"start_unix_us\":{epoch_unix_us}}}}}\n",
        quote(job),
        ev.dropped
    ));
    out
}

fn render_event(out: &mut String, e: &Event, rank: u32) {
    let us = |ns: u64| format!("{}.{:03}", ns / 1000, ns % 1000);
    let (name, cat, args) = match &e.kind {
        Kind::Op(o) => (
            o.name,
            "op",
            format!(
                "\"op\":{},\"dtype\":{},\"count\":{},\"bytes\":{},\"algorithm\":{},\"comm\":\"{:016x}\",\"epoch\":{},\"rank\":{},\"size\":{}",
                quote(o.name),
                quote(o.dtype),
                o.count,
                o.bytes,
                quote(o.algorithm),
                o.comm,
                o.epoch,
                o.rank,
                o.size
            ) + if o.failed { ",\"failed\":true" } else { "" },
        ),
        Kind::Transfer { peer, world, bytes, send } => {
            let dir = if *send { "send" } else { "recv" };
            (dir, "transfer", format!("\"peer\":{peer},\"peer_world\":{world},\"bytes\":{bytes},\"dir\":\"{dir}\""))
        }
        Kind::Straggler { world } => ("straggler link", "link", format!("\"peer_world\":{world}")),
    };
    out.push_str(&format!(
        "{{\"name\":{},\"cat\":\"{cat}\",\"ph\":\"X\",\"ts\":{},\"dur\":{},\"pid\":{rank},\"tid\":{},\"args\":{{{args}}}}}",
        quote(name),
        us(e.start_ns),
        us(e.dur_ns),
        e.tid
    ));
}

/// `s` as a JSON string literal.
fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            c if (c as u32) < 0x20 => q.push_str(&format!("\\u{:04x}", c as u32)),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_escapes_what_json_requires() {
        assert_eq!(quote("a\"b\\c\n\u{1}é"), "\"a\\\"b\\\\c\\u000a\\u0001é\"");
    }

    #[test]
    fn render_sorts_per_thread_and_names_the_rank() {
        let info = OpInfo {
            name: "allreduce",
            dtype: "fp32",
            count: 4,
            bytes: 16,
            algorithm: "ring",
            comm: 0xab,
            epoch: 0,
            rank: 1,
            size: 2,
            failed: false,
        };
        let ev = Events {
            list: vec![
                Event {
                    kind: Kind::Transfer { peer: 0, world: 0, bytes: 8, send: true },
                    start_ns: 1500,
                    dur_ns: 10,
                    tid: 1,
                },
                Event { kind: Kind::Op(info), start_ns: 1000, dur_ns: 2000, tid: 1 },
            ],
            dropped: 3,
            rank: Some(1),
        };
        let s = render(&ev, 1, "j\"ob", 7);
        let op = s.find("\"name\":\"allreduce\"").unwrap_or(usize::MAX);
        let tx = s.find("\"name\":\"send\"").unwrap_or(0);
        assert!(op < tx, "the op starts first: {s}");
        assert!(s.contains("\"ts\":1.000,\"dur\":2.000,\"pid\":1,\"tid\":1"), "{s}");
        assert!(s.contains("\"comm\":\"00000000000000ab\""), "{s}");
        assert!(s.contains("\"job\":\"j\\\"ob\",\"rank\":1,\"dropped\":3,\"start_unix_us\":7}"), "{s}");
    }
}
