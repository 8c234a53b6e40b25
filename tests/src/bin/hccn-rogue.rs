//! Rogue peers against a live job (run by tests/tests/rogue.rs under `hccnrun -n 4`). Lines
//! starting with an upper-case word are read by the test.
//!
//! Phase 1, a rank's listening port: ranks 0..2 start building the world at once and wait for
//! rank 3. Before joining, rank 3 plays the attacker against rank 0's listener (its address is
//! in the store): a connection that sends nothing, a wrong token, random bytes, a valid frame
//! header with an absurd length instead of a handshake, a slow sender that never finishes, a
//! token holder naming a rank that is not expected, and a replay of that holder's captured
//! handshake. Then rank 3 joins and the world must form.
//!
//! Phase 2, the store's port (the store lives in hccnrun): all ranks run exactly verified
//! allreduces while a thread of rank 3 repeats the same attacks against the store for `ROUNDS`
//! rounds, plus a token holder sending a request with an absurd length. Each rank samples its
//! own VmRSS and open descriptors after warming up and at the end; rank 3 samples hccnrun's.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hccn_runtime::auth::{self, Purpose};
use hccn_runtime::config::Meet;
use hccn_runtime::wire::{FrameHeader, FrameKind};
use hccn_runtime::{Communicator, Config, LaunchEnv, ReduceOp, StoreAddr};

const ROUNDS: u32 = 12;
/// Samples are taken after this many rounds (warm) and after the last.
const WARM_ROUND: u32 = 3;

/// VmRSS in KiB and the number of open descriptors of `pid`.
fn sample(pid: u32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
    (rss, fds)
}

fn random_bytes(n: usize, seed: &mut u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed as u8
        })
        .collect()
}

/// Writes through to a socket and keeps a copy of what was written: a wiretap on the client side.
struct Tap<'a> {
    sock: &'a mut TcpStream,
    sent: Vec<u8>,
}

impl Read for Tap<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.sock.read(buf)
    }
}

impl Write for Tap<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.sock.write(buf)?;
        self.sent.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.sock.flush()
    }
}

fn connect(addr: SocketAddr) -> Option<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(15)));
    Some(s)
}

/// True when the other side closed the connection without accepting: for a handshake, the
/// verdict byte (after the 64 bytes of challenge) is never 1.
fn refused(mut s: TcpStream) -> bool {
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return got.get(64) != Some(&1),
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// One round of attacks on `addr`; returns how many were refused as they should be. `slow` gets
/// the slow senders, which the caller closes later.
fn attack(
    addr: SocketAddr,
    purpose: Purpose,
    token: &[u8],
    seed: &mut u64,
    slow: &mut Vec<TcpStream>,
) -> Vec<(&'static str, bool)> {
    let mut out = Vec::new();
    // No token: connect and say nothing, then leave.
    if let Some(s) = connect(addr) {
        let _ = s.shutdown(std::net::Shutdown::Write);
        out.push(("no-token", refused(s)));
    }
    // A wrong token.
    if let Some(mut s) = connect(addr) {
        let r = auth::client_io(&mut s, b"not the job token", purpose);
        out.push(("wrong-token", r.is_err()));
    }
    // Random bytes.
    if let Some(mut s) = connect(addr) {
        let _ = s.write_all(&random_bytes(4096, seed));
        let _ = s.shutdown(std::net::Shutdown::Write);
        out.push(("random-bytes", refused(s)));
    }
    // A valid frame header announcing an absurd payload, instead of a handshake.
    if let Some(mut s) = connect(addr) {
        let h = FrameHeader { len: u64::MAX, ..FrameHeader::control(FrameKind::Collective, 1, 0, 1, 0) };
        let _ = s.write_all(&h.encode());
        let _ = s.write_all(&random_bytes(4096, seed));
        let _ = s.shutdown(std::net::Shutdown::Write);
        out.push(("absurd-length", refused(s)));
    }
    // A slow sender: half a hello, then nothing (held open by the caller).
    if let Some(mut s) = connect(addr) {
        let _ = s.write_all(b"HCCNAU");
        slow.push(s);
        out.push(("slow-sender", true));
    }
    // A token holder's handshake, captured on the wire, replayed by someone without the token.
    if let Some(mut s) = connect(addr) {
        let mut tap = Tap { sock: &mut s, sent: Vec::new() };
        let captured = auth::client_io(&mut tap, token, purpose).map(|_| tap.sent);
        match captured {
            Ok(bytes) => {
                if purpose == Purpose::Peer {
                    // The holder names a rank this communicator does not expect.
                    let mut hello = [0u8; 16];
                    hello[8..12].copy_from_slice(&99u32.to_le_bytes());
                    hello[12..16].copy_from_slice(&4u32.to_le_bytes());
                    let _ = s.write_all(&hello);
                    let _ = s.shutdown(std::net::Shutdown::Write);
                    out.push(("not-a-member", refused(s)));
                } else {
                    // The holder sends a SET whose value length is absurd.
                    let mut req = vec![1u8];
                    req.extend_from_slice(&1u32.to_le_bytes());
                    req.push(b'k');
                    req.extend_from_slice(&u32::MAX.to_le_bytes());
                    let _ = s.write_all(&req);
                    out.push(("store-absurd-value", refused(s)));
                }
                if let Some(mut r) = connect(addr) {
                    let _ = r.write_all(&bytes);
                    let _ = r.shutdown(std::net::Shutdown::Write);
                    out.push(("replay", refused(r)));
                }
            }
            Err(e) => {
                println!("CAPTURE_FAILED {e}");
                out.push(("capture", false));
            }
        }
    }
    out
}

fn report(phase: &str, results: &[(&str, bool)]) -> bool {
    let mut ok = true;
    for (what, refused) in results {
        println!("ATTACK {phase} {what} refused={refused}");
        ok &= *refused;
    }
    ok
}

fn run() -> Result<bool, String> {
    let env = LaunchEnv::from_env().map_err(|e| e.to_string())?;
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    hccn_runtime::log::init(&cfg);
    let me = env.rank;
    println!("PID {}", std::process::id());
    let Meet::Store(StoreAddr::Tcp(store_addr)) = env.meet else { return Err("needs hccnrun's store".into()) };
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(me);
    let mut all_refused = true;

    if me == 3 {
        let store = StoreAddr::Tcp(store_addr).connect(&env.job_token, cfg.timeout).map_err(|e| e.to_string())?;
        // The embedded store holds one run: generation 1.
        let world =
            hccn_runtime::rendezvous::runs::world_prefix(&hccn_runtime::rendezvous::runs::job_root(&env.job_id), 1, 0);
        let key = format!("{world}/addr/0");
        let raw = store.get(&key, cfg.timeout).map_err(|e| e.to_string())?;
        // A record: the protocol and version, then the address (rendezvous/ondemand.rs).
        let record = String::from_utf8_lossy(&raw);
        let rank0: SocketAddr = record
            .split(' ')
            .find_map(|w| w.parse().ok())
            .ok_or_else(|| format!("bad address of rank 0 in {record:?}"))?;
        let mut slow = Vec::new();
        let results = attack(rank0, Purpose::Peer, &env.job_token, &mut seed, &mut slow);
        all_refused &= report("rank", &results);
        println!("RANK_ATTACKS_DONE n={}", results.len());
        // The slow sender stays open while rank 3 joins: it must not hold the world up.
        let comm = Communicator::init_from_env(&env, &cfg).map_err(|e| e.to_string())?;
        drop(slow);
        return phase2(comm, me, store_addr, &env.job_token, seed).map(|ok| ok && all_refused);
    }
    let comm = Communicator::init_from_env(&env, &cfg).map_err(|e| e.to_string())?;
    phase2(comm, me, store_addr, &env.job_token, seed)
}

fn phase2(comm: Communicator, me: u32, store_addr: SocketAddr, token: &[u8], seed: u64) -> Result<bool, String> {
    let n = comm.size();
    println!("WORLD rank={me} size={n}");
    let attacking = Arc::new(AtomicBool::new(me == 3));
    let round = Arc::new(AtomicU32::new(0));
    let attacker = (me == 3).then(|| {
        let (attacking, round, token) = (attacking.clone(), round.clone(), token.to_vec());
        std::thread::spawn(move || {
            let host = std::os::unix::process::parent_id();
            let mut seed = seed;
            let mut ok = true;
            let mut warm = (0, 0);
            let mut slow = Vec::new();
            for r in 1..=ROUNDS {
                let results = attack(store_addr, Purpose::Store, &token, &mut seed, &mut slow);
                ok &= report("store", &results);
                // Slow senders of the previous round give up now; this round's stay open.
                if slow.len() > 1 {
                    slow.drain(..slow.len() - 1);
                }
                round.store(r, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(200));
                if r == WARM_ROUND {
                    std::thread::sleep(Duration::from_millis(300));
                    warm = sample(host);
                }
            }
            drop(slow);
            // The store's connection threads see the closed sockets and end, however loaded the
            // machine: wait (up to 20 s) for the descriptors to come back to the warm count.
            let mut end = sample(host);
            for _ in 0..80 {
                if end.1 <= warm.1 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(250));
                end = sample(host);
            }
            println!(
                "SAMPLE store-host warm_rss_kb={} warm_fds={} end_rss_kb={} end_fds={}",
                warm.0, warm.1, end.0, end.1
            );
            attacking.store(false, Ordering::SeqCst);
            ok
        })
    });

    let count = 1 << 16;
    let mut wrong = 0usize;
    let mut iters = 0u32;
    let mut warm = None;
    let me_pid = std::process::id();
    loop {
        // Element 0 carries rank 3's "still attacking" flag; the rest is checked exactly.
        let mut send: Vec<i64> = (0..count).map(|j| (j % 11) as i64 + i64::from(me)).collect();
        send[0] = i64::from(attacking.load(Ordering::SeqCst));
        let mut recv = vec![0i64; count];
        comm.all_reduce(&send, &mut recv, ReduceOp::Sum).map_err(|e| format!("allreduce {iters}: {e}"))?;
        let base = i64::from(n * (n - 1) / 2);
        wrong += (1..count).filter(|&j| recv[j] != i64::from(n) * (j % 11) as i64 + base).count();
        iters += 1;
        if iters == 5 {
            warm = Some(sample(me_pid));
        }
        if recv[0] == 0 && iters >= 10 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let end = sample(me_pid);
    let warm = warm.unwrap_or(end);
    println!("SAMPLE rank{me} warm_rss_kb={} warm_fds={} end_rss_kb={} end_fds={}", warm.0, warm.1, end.0, end.1);
    println!("JOB_OK iters={iters} wrong={wrong} rounds={}", round.load(Ordering::SeqCst));
    let attacks_ok = attacker.map(|t| t.join().unwrap_or(false)).unwrap_or(true);
    Ok(wrong == 0 && attacks_ok)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            println!("FAILED");
            ExitCode::FAILURE
        }
        Err(e) => {
            println!("ERROR {e}");
            ExitCode::FAILURE
        }
    }
}
