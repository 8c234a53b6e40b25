//! How a rank's process starts: hccnrun spawns itself (`/proc/self/exe`) in a mode that binds
//! the process to its core, makes it die with hccnrun, places its lifeline (exits.rs), then
//! executes the rank's program in the same process. A `fork` of hccnrun copies its page tables,
//! which grow with the ranks it attends (three threads each): starting 1,024 ranks of
//! `/bin/true` took 31 s, quadratic in the ranks (128: 0.6 s, 512: 8.1 s). A spawn without a
//! closure to run before `exec` is a `posix_spawn`, which copies nothing.

use std::convert::Infallible;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// The first argument of hccnrun in this mode (not an option users give).
pub(crate) const FLAG: &str = "--exec-rank-for-hccnrun";

/// What the rank's process does before its program starts.
pub(super) struct Setup {
    /// The CPU to bind to (`--bind-to core`).
    pub cpu: Option<usize>,
    /// The lifeline's write end, and the descriptor number it goes to in the rank.
    pub lifeline: Option<(OwnedFd, i32)>,
}

/// `rank` (the program, its arguments and environment as the rank gets them) started through
/// hccnrun itself with `setup`; its stdin is /dev/null.
pub(super) fn wrap(rank: &Command, setup: Setup) -> io::Result<Command> {
    findable(rank)?;
    let mut cmd = Command::new("/proc/self/exe");
    let cpu = setup.cpu.map_or_else(|| "-".to_owned(), |c| c.to_string());
    let at = setup.lifeline.as_ref().map_or_else(|| "-".to_owned(), |(_, at)| at.to_string());
    cmd.arg(FLAG).arg(std::process::id().to_string()).arg(cpu).arg(at).arg("--");
    cmd.arg(rank.get_program()).args(rank.get_args());
    for (k, v) in rank.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    // The lifeline comes in as stdin (the one descriptor a spawn places besides the output
    // pipes); the rank moves it to its number and takes /dev/null as stdin.
    cmd.stdin(setup.lifeline.map_or_else(Stdio::null, |(w, _)| Stdio::from(w)));
    Ok(cmd)
}

/// Whether `rank`'s program can be found, so that a missing one is named by hccnrun as before
/// (an `exec` that fails later is reported by the rank's process, exit code 127 or 126).
fn findable(rank: &Command) -> io::Result<()> {
    let program = rank.get_program();
    if program.as_bytes().contains(&b'/') {
        std::fs::metadata(program)?;
        return match is_executable(Path::new(program)) {
            true => Ok(()),
            false => Err(io::Error::from(io::ErrorKind::PermissionDenied)),
        };
    }
    let path = rank.get_envs().find(|(k, _)| *k == "PATH").and_then(|(_, v)| v.map(OsStr::to_owned));
    let path = path.or_else(|| std::env::var_os("PATH")).unwrap_or_default();
    match std::env::split_paths(&path).any(|dir| is_executable(&dir.join(program))) {
        true => Ok(()),
        false => Err(io::Error::new(io::ErrorKind::NotFound, "not found on PATH")),
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The rank's side (`args`: what follows [`FLAG`]): never returns.
pub(crate) fn run(args: &[OsString]) -> ! {
    let code = match start(args) {
        Ok(never) => match never {},
        Err(e) => {
            let _ =
                io::Write::write_all(&mut io::stderr(), format!("hccnrun: cannot start the rank: {e}\n").as_bytes());
            if e.kind() == io::ErrorKind::NotFound {
                127
            } else {
                126
            }
        }
    };
    std::process::exit(code)
}

fn start(args: &[OsString]) -> io::Result<Infallible> {
    let bad = || io::Error::new(io::ErrorKind::InvalidInput, format!("{FLAG}: malformed arguments {args:?}"));
    let [parent, cpu, at, dashes, program, rest @ ..] = args else { return Err(bad()) };
    let number = |s: &OsString| s.to_str().and_then(|s| s.parse::<i64>().ok());
    let parent = number(parent).ok_or_else(bad)?;
    if dashes != "--" {
        return Err(bad());
    }
    // SAFETY: prctl and getppid with integer arguments.
    unsafe {
        // The process dies with hccnrun even when hccnrun is SIGKILLed (what it starts in
        // turn: the watcher, see guard.rs).
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        // hccnrun may have died before the prctl took effect.
        if i64::from(libc::getppid()) != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
    }
    if let Some(cpu) = number(cpu) {
        let cpu = usize::try_from(cpu).ok().filter(|&c| c < libc::CPU_SETSIZE as usize).ok_or_else(bad)?;
        bind(cpu)?;
    }
    if let Some(at) = number(at) {
        let at = i32::try_from(at).map_err(|_| bad())?;
        // A copy without close-on-exec, which the program keeps; failing only loses the precise
        // timing of its end.
        let null = std::fs::File::open("/dev/null")?;
        // SAFETY: dup2 on descriptors this process holds (0: the lifeline; `null`).
        unsafe {
            libc::dup2(0, at);
            libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 0);
        }
    }
    Err(Command::new(program).args(rest).exec())
}

fn bind(cpu: usize) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes within it (cpu < CPU_SETSIZE).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_that_cannot_start_is_named_before_the_spawn() {
        let kind = |program: &str| findable(&Command::new(program)).err().map(|e| e.kind());
        assert_eq!(kind("sh"), None);
        assert_eq!(kind("/bin/sh"), None);
        assert_eq!(kind("no-such-program-for-hccnrun"), Some(io::ErrorKind::NotFound));
        assert_eq!(kind("/no/such/program"), Some(io::ErrorKind::NotFound));
        assert_eq!(kind("/etc/passwd"), Some(io::ErrorKind::PermissionDenied));
        assert_eq!(kind("/tmp"), Some(io::ErrorKind::PermissionDenied));
        // The rank's own PATH decides.
        let mut cmd = Command::new("sh");
        cmd.env("PATH", "/nonexistent");
        assert_eq!(findable(&cmd).err().map(|e| e.kind()), Some(io::ErrorKind::NotFound));
    }

    #[test]
    fn malformed_arguments_are_refused_not_run() {
        let args: Vec<OsString> = ["1", "-", "-", "-", "true"].iter().map(OsString::from).collect();
        let e = start(&args).expect_err("no -- before the program");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = start(&args[..2]).expect_err("too few");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
