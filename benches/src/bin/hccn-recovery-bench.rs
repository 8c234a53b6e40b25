//! Recovery under repeated faults, in real processes:
//!   hccnrun --elastic --max-restarts F -n 4 -- hccn-recovery-bench --faults F
//! Every 10 training steps (an allreduce each) one rank, a different one each time and rank 0
//! among them, SIGKILLs itself; the survivors detect it, shrink (agreement), then rebuild to admit
//! the replacement hccnrun starts, which receives the training state by broadcast. The last rank 0
//! prints p50/p99 of detection (from the victim's kill time), shrink, and admission times, the
//! steps lost, and the hangs (an agreement or admission that timed out).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hccn_benches::percentile;
use hccn_runtime::{Communicator, Config, DataType, LaunchEnv, Op, Ptr, ReduceOp};

const STEP_FLOATS: usize = 1 << 18;
const STEPS_BETWEEN_FAULTS: u64 = 10;

fn now_us() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0)
}

fn step(c: &Communicator, send: &[f32], recv: &mut [f32]) -> hccn_runtime::Result<()> {
    c.all_reduce(send, recv, ReduceOp::Sum)
}

/// Rank 0 of `c` sends the training state (step, fault index) to everyone, joiners included.
fn sync_state(c: &Communicator, state: &mut [u64; 2]) -> hccn_runtime::Result<()> {
    let op = Op::Broadcast { buf: Ptr::from_mut(state.as_mut_ptr()), count: 2, dt: DataType::Uint64, root: 0 };
    // SAFETY: `state` lives for the whole blocking call.
    unsafe { c.submit(op, None) }
}

fn main() {
    let faults: u64 =
        std::env::args().skip_while(|a| a != "--faults").nth(1).and_then(|v| v.parse().ok()).unwrap_or(100);
    if let Err(e) = run(faults) {
        eprintln!("hccn-recovery-bench: {e}");
        std::process::exit(1);
    }
}

fn run(faults: u64) -> Result<(), String> {
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    hccn_runtime::log::init(&cfg);
    let env = LaunchEnv::from_env().map_err(|e| e.to_string())?;
    let dir = std::env::temp_dir().join(format!("hccn-recovery-{}", env.job_id));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut comm = Communicator::init_from_env(&env, &cfg).map_err(|e| e.to_string())?;
    let mut state = [0u64; 2]; // completed steps, faults injected
    if comm.epoch() > 0 {
        sync_state(&comm, &mut state).map_err(|e| e.to_string())?;
    }
    let send = vec![1.0f32; STEP_FLOATS];
    let mut recv = vec![0.0f32; STEP_FLOATS];
    // Steps that failed and were redone, over the faults this process lived through.
    let (mut redone, mut witnessed) = (0u64, 0u64);
    while state[1] < faults {
        // Fault k strikes at step 10(k+1), so a recovery never triggers the next one at once.
        let victim = (state[1] % comm.size() as u64) as u32;
        if state[0] == (state[1] + 1) * STEPS_BETWEEN_FAULTS && comm.rank() == victim {
            // Leave the kill time for the survivors.
            let _ = std::fs::write(dir.join(format!("kill-{}", state[1])), now_us().to_string());
            // SAFETY: raising a signal at ourselves.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        if step(&comm, &send, &mut recv).is_ok() {
            state[0] += 1;
            continue;
        }
        redone += 1;
        witnessed += 1;
        let detected = now_us();
        let killed = std::fs::read_to_string(dir.join(format!("kill-{}", state[1])))
            .ok()
            .and_then(|t| t.trim().parse::<u128>().ok())
            .unwrap_or(detected);
        let (record, next) = recover(&comm);
        let line = match &record {
            Ok((shrink, grow)) => format!("{} {shrink} {grow}", (detected - killed.min(detected)) as f64 / 1e3),
            Err(e) => format!("hang {e}"),
        };
        let _ = std::fs::write(dir.join(format!("rec-{}-{}", state[1], std::process::id())), &line);
        comm = next.ok_or(line)?;
        state[1] += 1;
        sync_state(&comm, &mut state).map_err(|e| e.to_string())?;
    }
    // Everyone is done once rank 0 has passed this barrier: only then read the records.
    comm.barrier().map_err(|e| e.to_string())?;
    if comm.rank() == 0 {
        report(&dir, faults, comm.size(), state[0], redone as f64 / witnessed.max(1) as f64);
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// Shrink (agreement), then rebuild to admit the replacement; returns both times in ms.
fn recover(comm: &Communicator) -> (Result<(f64, f64), String>, Option<Communicator>) {
    let t = Instant::now();
    let small = match comm.shrink() {
        Ok(s) => s,
        Err(e) => return (Err(format!("shrink: {e}")), None),
    };
    let shrink = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    match small.rebuild(Duration::from_secs(30)) {
        Ok(big) => (Ok((shrink, t.elapsed().as_secs_f64() * 1e3)), Some(big)),
        Err(e) => (Err(format!("rebuild: {e}")), None),
    }
}

fn report(dir: &std::path::Path, faults: u64, ranks: u32, steps: u64, lost_per_fault: f64) {
    let (mut detect, mut shrink, mut grow, mut hangs) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if !e.file_name().to_string_lossy().starts_with("rec-") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let v: Vec<f64> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        match v.as_slice() {
            [d, s, g] => {
                detect.push(*d);
                shrink.push(*s);
                grow.push(*g);
            }
            _ => hangs += 1,
        }
    }
    println!("# hccn recovery: {faults} faults, {} survivor records, {ranks} ranks per job", detect.len());
    println!("# {:<28} {:>9} {:>9}", "time (ms)", "p50", "p99");
    for (name, v) in [
        ("detection (kill -> error)", &mut detect),
        ("agreement + shrink", &mut shrink),
        ("admit replacement (rebuild)", &mut grow),
    ] {
        println!("  {:<28} {:>9.2} {:>9.2}", name, percentile(v, 50.0), percentile(v, 99.0));
    }
    println!("# steps completed {steps}, steps lost per fault {lost_per_fault:.2}, hangs {hangs}");
}
