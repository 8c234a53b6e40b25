//! Nothing a rank starts outlives hccnrun, however it is wrapped (`sh -c ...`, a script that
//! starts the real program, which the parent-death signal of the process hccnrun starts does not
//! reach):
//!
//! - hccnrun is a child subreaper: what a rank leaves behind when it exits is adopted by hccnrun
//!   (not by init), which reaps it meanwhile and ends it on the way out;
//! - each rank runs in its own process group, which hccnrun kills before it reaps the rank;
//! - for the one case hccnrun cannot handle itself, its own SIGKILL, a small watcher shell holds
//!   the read end of a pipe whose write end only hccnrun has: hccnrun writes each rank's process
//!   group to it as the rank starts and again once it is reaped, and when the pipe ends (hccnrun
//!   is gone, however) the watcher kills the groups still listed. It runs with an empty
//!   environment and its own command line, so that nothing of the job's shows in it.

use std::collections::HashSet;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hccn_runtime::sync::Locked;

/// The watcher: `+ GROUP` lists a group, `- GROUP` drops it; at the end of its input it kills
/// those listed. A terminal's signals are for hccnrun, which handles them.
const WATCHER: &str = r#"trap '' INT TERM HUP PIPE
groups=' '
while read -r op g; do
  case $op$groups in
    +*) groups="$groups$g " ;;
    -*" $g "*) groups="${groups%%" $g "*} ${groups#*" $g "}" ;;
  esac
done
for g in $groups; do kill -s KILL -- "-$g" 2>/dev/null; done"#;

/// hccnrun's side of the watcher.
#[derive(Debug)]
pub(super) struct Guard {
    watcher: Child,
    /// The pipe's write end (close-on-exec: no rank holds it).
    lifeline: Mutex<Option<ChildStdin>>,
}

impl Guard {
    /// Makes hccnrun a subreaper and starts the watcher.
    pub(super) fn start() -> Result<Guard, String> {
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            super::say(format_args!(
                "cannot adopt what ranks leave behind ({}); a rank's own children may outlive it",
                std::io::Error::last_os_error()
            ));
        }
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(WATCHER).arg("hccnrun-watcher").env_clear();
        cmd.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null()).process_group(0);
        let mut watcher = cmd.spawn().map_err(|e| format!("cannot start the watcher shell (/bin/sh): {e}"))?;
        let lifeline = Mutex::new(watcher.stdin.take());
        Ok(Guard { watcher, lifeline })
    }

    pub(super) fn pid(&self) -> i32 {
        self.watcher.id() as i32
    }

    fn tell(&self, what: char, group: i32) {
        if let Some(pipe) = self.lifeline.locked().as_mut() {
            // A watcher that died cannot be helped (SIGPIPE is ignored in Rust programs).
            let _ = writeln!(pipe, "{what} {group}");
        }
    }

    /// A rank started in process group `group`.
    pub(super) fn watch(&self, group: i32) {
        self.tell('+', group);
    }

    /// Rank `group` has been reaped (its group was killed first).
    pub(super) fn release(&self, group: i32) {
        self.tell('-', group);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // The watcher then ends (nothing is listed after a clean end) and is reaped.
        self.lifeline.locked().take();
        let _ = self.watcher.wait();
    }
}

/// The children of hccnrun (of any of its threads), from /proc.
fn children() -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let mut out: Vec<i32> = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|list| list.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<i32>>())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Reaps the adopted processes (not in `own`: what hccnrun started itself) that have exited.
pub(super) fn reap_adopted(own: &HashSet<i32>) {
    for pid in children().into_iter().filter(|p| !own.contains(p)) {
        // SAFETY: a child of ours that nothing else waits for; WNOHANG never blocks.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
    }
}

/// On the way out: kills and reaps every adopted process (and its group), until none is left or
/// `limit` has passed.
pub(super) fn end_adopted(own: &HashSet<i32>, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let left: Vec<i32> = children().into_iter().filter(|p| !own.contains(p)).collect();
        if left.is_empty() || Instant::now() >= deadline {
            return;
        }
        for &pid in &left {
            // SAFETY: an unreaped child of ours (so the pid is still its), and its group if it
            // leads one; whatever they leave is adopted and found on the next round.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
