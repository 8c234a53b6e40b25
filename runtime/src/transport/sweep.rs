//! Shared-memory files left behind. A segment's or board's name is unlinked as soon as every
//! peer has mapped it, but a process killed between creating and unlinking it (a SIGKILL during
//! set-up) leaves the file in /dev/shm, where its pages stay allocated. The first world a
//! process forms sweeps them: a file of hccn's whose creator (its pid is in the name) is gone,
//! and which is older than any set-up could still be using it.

use std::time::{Duration, SystemTime};

/// Younger files may belong to a set-up in progress in another pid namespace.
const MIN_AGE: Duration = Duration::from_secs(5);

/// The creator's pid in an hccn shared-memory file name: `hccn-<mesh>-<pid>-<me>-<peer>` (ring
/// segments) or `hccn-board-<pid>-<id>-<epoch>-<nonce>`.
fn owner(name: &str) -> Option<i32> {
    let rest = name.strip_prefix("hccn-")?;
    let rest = match rest.strip_prefix("board-") {
        Some(r) => r,
        None => {
            let (mesh, r) = rest.split_once('-')?;
            (mesh.len() == 16 && mesh.bytes().all(|b| b.is_ascii_hexdigit())).then_some(r)?
        }
    };
    rest.split('-').next()?.parse().ok()
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Removes the stale files of `dir` (once per process for /dev/shm); returns how many.
pub(crate) fn sweep(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let now = SystemTime::now();
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner(&name) else { continue };
        let old =
            e.metadata().and_then(|m| m.modified()).is_ok_and(|t| now.duration_since(t).unwrap_or_default() >= MIN_AGE);
        if old && !alive(pid) && std::fs::remove_file(e.path()).is_ok() {
            tracing::info!("removed {name}: shared memory left by process {pid}, which is gone");
            removed += 1;
        }
    }
    removed
}

/// [`sweep`] of /dev/shm, the first time a world forms in this process.
pub(crate) fn once() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        sweep(std::path::Path::new("/dev/shm"));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_give_their_creator() {
        assert_eq!(owner("hccn-00000000000000ab-4242-0-1"), Some(4242));
        assert_eq!(owner("hccn-board-77-00000000000000ab-0-1234abcd"), Some(77));
        assert_eq!(owner("other-1-2"), None);
        assert_eq!(owner("hccn-unit-5-true-false"), None);
    }

    #[test]
    fn only_old_files_of_dead_creators_go() {
        let dir = std::env::temp_dir().join(format!("hccn-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let dead = std::process::Command::new("true").spawn().and_then(|mut c| c.wait().map(|_| c.id())).expect("true");
        let me = std::process::id();
        let old = SystemTime::now() - Duration::from_secs(3600);
        for (name, age) in [
            (format!("hccn-0000000000000001-{dead}-0-1"), Some(old)),
            (format!("hccn-board-{dead}-0000000000000001-0-0"), Some(old)),
            (format!("hccn-0000000000000002-{dead}-0-1"), None),
            (format!("hccn-0000000000000003-{me}-0-1"), Some(old)),
        ] {
            let f = std::fs::File::create(dir.join(&name)).expect("file");
            if let Some(t) = age {
                f.set_modified(t).expect("mtime");
            }
        }
        assert_eq!(sweep(&dir), 2, "the two old files of a dead process");
        let left: Vec<String> = std::fs::read_dir(&dir)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left.len(), 2, "a young file and a live creator's stay: {left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
