//! Forwarding a rank's output: line by line to hccnrun's stdout or stderr, prefixed with the rank
//! the process holds as the line goes out, and unprefixed to its files under `--output-dir`.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::roster::{Label, Roster};

/// Where one process's output goes besides hccnrun's own.
#[derive(Debug, Default)]
pub(super) struct Files {
    pub(super) stdout: Option<File>,
    pub(super) stderr: Option<File>,
}

/// `DIR/rank.R/` for the process started as rank `slot`, `DIR/rank.R.restart.K/` for the
/// replacement started as restart `K`.
fn dir_of(dir: &Path, slot: u32, restart: Option<u32>) -> PathBuf {
    match restart {
        None => dir.join(format!("rank.{slot}")),
        Some(k) => dir.join(format!("rank.{slot}.restart.{k}")),
    }
}

impl Files {
    /// Creates (truncates) the output files of one process under `dir`, if given.
    pub(super) fn create(dir: Option<&Path>, slot: u32, restart: Option<u32>) -> io::Result<Files> {
        let Some(dir) = dir else { return Ok(Files::default()) };
        let dir = dir_of(dir, slot, restart);
        let named = |e: io::Error, what: &Path| io::Error::new(e.kind(), format!("{}: {e}", what.display()));
        std::fs::create_dir_all(&dir).map_err(|e| named(e, &dir))?;
        let open = |name: &str| {
            let path = dir.join(name);
            File::create(&path).map_err(|e| named(e, &path))
        };
        Ok(Files { stdout: Some(open("stdout")?), stderr: Some(open("stderr")?) })
    }
}

/// Copies `pipe` to hccnrun's stdout or stderr line by line, each line prefixed with the rank,
/// and to `file` as it is.
fn forward(label: Label, roster: Arc<Roster>, pipe: impl Read, to_stderr: bool, mut file: Option<File>) {
    let mut reader = BufReader::with_capacity(64 << 10, pipe);
    let mut text = Vec::new();
    let mut line = Vec::new();
    loop {
        text.clear();
        match reader.read_until(b'\n', &mut text) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if !text.ends_with(b"\n") {
            text.push(b'\n');
        }
        if let Some(f) = file.as_mut() {
            // A full disk loses the file's copy, never the terminal's.
            if f.write_all(&text).is_err() {
                file = None;
            }
        }
        roster.refresh();
        line.clear();
        line.extend_from_slice(label.prefix().as_bytes());
        line.extend_from_slice(&text);
        // A closed terminal or pipe must not stop the draining, or the rank would block on a
        // full pipe; its output is then lost, as it would be without hccnrun.
        let _ = if to_stderr {
            io::stderr().lock().write_all(&line)
        } else {
            let mut out = io::stdout().lock();
            out.write_all(&line).and_then(|()| out.flush())
        };
    }
}

/// Starts the thread that forwards one of a process's pipes.
pub(super) fn start(
    name: String,
    label: Label,
    roster: Arc<Roster>,
    pipe: impl Read + Send + 'static,
    to_stderr: bool,
    file: Option<File>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name).spawn(move || forward(label, roster, pipe, to_stderr, file))
}
