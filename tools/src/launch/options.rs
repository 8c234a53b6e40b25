//! hccnrun's command line: its own options and the torchrun and mpirun spellings people type
//! first (`--nproc-per-node`, `-np`, `-x VAR`, `--oversubscribe`).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::args::{self, Args, UsageError};
use crate::hostfile::{self, Host};

/// How `--hostfile` starts remote ranks unless `--remote-cmd` says otherwise.
pub(super) const DEFAULT_REMOTE: &str = "ssh -o BatchMode=yes";

pub const USAGE: &str = "\
usage: hccnrun -n N [options] [--] PROGRAM [ARGS...]
       hccnrun --nproc-per-node N [options] SCRIPT.py [ARGS...]

Starts N ranks of PROGRAM on this host around an embedded rendezvous store, as torchrun and
mpirun start theirs. Each rank gets HCCN_RANK, HCCN_WORLD_SIZE, HCCN_LOCAL_RANK,
HCCN_LOCAL_WORLD_SIZE, HCCN_STORE, HCCN_JOB_ID and HCCN_JOB_TOKEN, and torchrun's RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the index of its host), MASTER_ADDR and
MASTER_PORT (a free port for torch's own store, never hccn's); OMP_NUM_THREADS=1 unless it is
set (as torchrun does). A PROGRAM ending in .py runs with `python3 -u` from PATH (the Python of
the hccn wheel when hccnrun is its console script). Each line a rank writes to stdout or stderr
is prefixed with \"[R] \", R the rank it holds as the line is forwarded: after a shrink or a
rebuild that its world records in hccnrun's store, its new rank; \"[joining]\" for a replacement
not admitted yet, \"[left]\" for a process its world went on without. Stdin is not forwarded.

  -n, -np, --np, --nproc-per-node N
                       ranks on this host (required unless --hostfile gives them)
  --nnodes M           the job spans M hosts, each running its own hccnrun with -n ranks; the
                       world has M*N ranks. Needs --store, and the same HCCN_JOB_ID and
                       HCCN_JOB_TOKEN in every hccnrun's environment; MASTER_ADDR and
                       MASTER_PORT are exported only when --master-addr and --master-port say
                       them (the hosts cannot agree on a free port by themselves)
  --node-rank I        this host's index (0..M-1): its ranks are I*N .. I*N+N-1
  --master-addr HOST, --master-port PORT
                       MASTER_ADDR and MASTER_PORT for the ranks (default: HCCN_BIND_ADDR and
                       a port free on it when hccnrun starts)
  -x VAR[=VALUE]       export VAR (its value here, or VALUE) to every rank, remote ones too
                       (mpirun's -x); may be repeated
  --output-dir DIR     also write each rank's output, unprefixed, to DIR/rank.R/stdout and
                       DIR/rank.R/stderr (R: the rank it was started as); a replacement started
                       for rank R as restart K writes to DIR/rank.R.restart.K/
  --python PATH        the interpreter for a PROGRAM ending in .py (default: python3)
  --no-python          run a PROGRAM ending in .py as it is
  --bind-to core|none  core: bind each rank started here to one of the CPUs hccnrun may use,
                       local rank i to the i-th modulo their number (as mpirun --bind-to core);
                       none (the default): the scheduler places them
  --oversubscribe, --standalone
                       accepted for mpirun's and torchrun's command lines; nothing to do
  --timeout SECONDS    stop the job and exit 124 when it runs longer
  --grace SECONDS      after a rank fails, how long the others may finish on their own before
                       they get SIGTERM (default 3); SIGKILL follows 1 s after SIGTERM
  --hostfile FILE      start the job from here across the hosts in FILE, one per line:
                       `NAME [slots=N] [addr=IP]` (ranks fill hosts in order; -n defaults to
                       all slots; `localhost` runs here). Remote ranks listen on addr= (else
                       NAME resolved); the embedded store listens on HCCN_BIND_ADDR, which must
                       then be an address the hosts reach
  --remote-cmd CMD     how remote ranks start (default `ssh -o BatchMode=yes`): `{host}` in CMD
                       is the host's name, else it is appended; e.g. `ip netns exec {host}`
  --store URL          use this rendezvous store (etcd://host:port[,host:port...] or
                       tcp://host:port) instead of hosting an embedded one
  --etcd-local         start a private etcd for the job (loopback, temporary data directory)
                       and stop it afterwards
  --elastic            a rank that fails does not stop the job: the others go on (they shrink
                       or rebuild their communicators) and a replacement is started, which joins
                       at the next epoch when the survivors call hccn_comm_rebuild
  --min-ranks M        with --elastic: give up when fewer than M ranks are left (default 1)
  --max-restarts K     with --elastic: replacements to start in all (default 3); a failure
                       after the last one ends the job
  --version            hccnrun's version
  -h, --help           this text

A rank that exits before the world has formed (the ranks that joined would wait for it until
HCCN_TIMEOUT_MS) stops the job at once, naming it. With --elastic, no replacement is started
once no member of the world is left to admit it; replacements still waiting then get the grace
period and are stopped. After a clean end with an etcd store, the job's keys are removed from it.

Ranks die with hccnrun, however they were started (`sh -c ...`, a script that starts the real
program): hccnrun adopts what they leave behind and ends their process groups, and a watcher
process ends them when hccnrun itself is killed. hccnrun raises its soft open-file limit, which
the ranks inherit, toward the hard one as far as the job needs, and says so when it cannot.

Exit status: 0 when every rank exits 0 (with --elastic: when every failure was outlived by a
rank that then exited 0); otherwise the exit code of the rank that failed first, by time (128+N
for signal N: 139 for a segmentation fault; 1 for a rank that exited 0 before the world
formed), 124 on timeout, 128+N when hccnrun receives signal N (SIGINT, SIGTERM, SIGHUP are
forwarded to the ranks; a second one kills them at once), 2 on bad usage, 127 when PROGRAM
cannot be found.
";

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub nranks: u32,
    pub timeout: Option<Duration>,
    pub grace: Duration,
    /// `Some` with --elastic.
    pub elastic: Option<Elastic>,
    /// An external store (`--store`); `None` hosts an embedded one.
    pub store: Option<String>,
    /// `--etcd-local`: start a private etcd for the job.
    pub etcd_local: bool,
    /// `--nnodes`, `--node-rank`: hosts in the job and this one's index.
    pub nnodes: u32,
    pub node_rank: u32,
    /// `--hostfile`: the hosts this hccnrun starts ranks on, and how.
    pub hosts: Option<Vec<Host>>,
    pub remote_cmd: String,
    /// `--bind-to core`: each rank started on this host runs on one CPU only.
    pub bind_to_core: bool,
    /// `-x`: variables exported to every rank, in order.
    pub exports: Vec<(String, String)>,
    /// `--output-dir`: per-rank output files.
    pub output_dir: Option<PathBuf>,
    /// `--python`: the interpreter of `*.py` programs; `--no-python` runs them as they are.
    pub python: Option<OsString>,
    pub no_python: bool,
    /// `--master-addr`, `--master-port`: MASTER_ADDR and MASTER_PORT as given.
    pub master_addr: Option<String>,
    pub master_port: Option<u16>,
    pub program: OsString,
    pub args: Vec<OsString>,
}

impl Options {
    /// Where rank `rank` runs (this host unless the host file puts it elsewhere).
    pub(super) fn place(&self, rank: u32) -> Result<hostfile::Place<'_>, String> {
        match &self.hosts {
            Some(hosts) => hostfile::place(hosts, self.nranks, rank),
            None => Ok(hostfile::Place {
                host: None,
                node: self.node_rank,
                local: rank - self.node_rank * self.nranks,
                local_size: self.nranks,
            }),
        }
    }

    /// Ranks in the whole job.
    pub(super) fn world_size(&self) -> u32 {
        self.nnodes * self.nranks
    }

    /// The command that starts the program: a script through Python, as torchrun runs it.
    pub(super) fn command_line(&self) -> (OsString, Vec<OsString>) {
        let script = std::path::Path::new(&self.program).extension().is_some_and(|e| e == "py");
        if !script || self.no_python {
            return (self.program.clone(), self.args.clone());
        }
        let python = self.python.clone().unwrap_or_else(|| "python3".into());
        // -u: unbuffered, so that lines reach hccnrun (and the terminal) as they are written.
        let mut args = vec![OsString::from("-u"), self.program.clone()];
        args.extend(self.args.iter().cloned());
        (python, args)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elastic {
    pub min_ranks: u32,
    pub max_restarts: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Invocation {
    Run(Box<Options>),
    Help,
    Version,
}

/// `-x VAR[=VALUE]`: VALUE, or VAR's value in hccnrun's environment.
fn export(spec: &str) -> Result<(String, String), UsageError> {
    let (name, value) = match spec.split_once('=') {
        Some((n, v)) => (n, Some(v.to_owned())),
        None => (spec, None),
    };
    let valid = !name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit());
    if !valid || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(UsageError(format!("-x {spec}: {name:?} is not a variable name")));
    }
    let value = match value {
        Some(v) => v,
        None => std::env::var(name).map_err(|_| {
            UsageError(format!("-x {name}: {name} is not set in hccnrun's environment (give -x {name}=VALUE)"))
        })?,
    };
    Ok((name.to_owned(), value))
}

/// What parsing has gathered so far (the options that are checked against each other).
#[derive(Default)]
struct Seen {
    nranks: Option<u32>,
    timeout: Option<Duration>,
    grace: Option<Duration>,
    elastic: bool,
    min_ranks: Option<u32>,
    max_restarts: Option<u32>,
    store: Option<String>,
    etcd_local: bool,
    nnodes: Option<u32>,
    node_rank: Option<u32>,
    hosts: Option<Vec<Host>>,
    remote_cmd: Option<String>,
    bind_to_core: bool,
    exports: Vec<(String, String)>,
    output_dir: Option<PathBuf>,
    python: Option<OsString>,
    no_python: bool,
    master_addr: Option<String>,
    master_port: Option<u16>,
}

/// Takes one option into `s`; `Some` when it ends parsing (help, version).
fn take(s: &mut Seen, a: &mut Args, name: &str, inline: Option<String>) -> Result<Option<Invocation>, UsageError> {
    let mut value = || a.value(name, inline.clone());
    match name {
        "-h" | "--help" => return Ok(Some(Invocation::Help)),
        "--version" => return Ok(Some(Invocation::Version)),
        // `-np` is mpirun's spelling, `--nproc-per-node` torchrun's: the ones people type first.
        "-n" | "-np" | "--np" | "--nproc-per-node" | "--nproc_per_node" => {
            let v = value()?;
            let n: u32 = args::number(name, &v)
                .map_err(|_| UsageError(format!("{name} {v:?}: the number of ranks on this host, a whole number")))?;
            if n == 0 {
                return Err(UsageError(format!("{name} must be at least 1")));
            }
            s.nranks = Some(n);
        }
        "--timeout" => {
            let t = args::seconds(name, &value()?)?;
            if t.is_zero() {
                return Err(UsageError("--timeout must be more than 0".into()));
            }
            s.timeout = Some(t);
        }
        "--grace" => s.grace = Some(args::seconds(name, &value()?)?),
        "--elastic" => s.elastic = true,
        "--etcd-local" => s.etcd_local = true,
        "--nnodes" => {
            let v = value()?;
            if v.contains(':') {
                return Err(UsageError(format!(
                    "--nnodes {v}: a range of hosts is torchrun's; here it is one number (see --elastic)"
                )));
            }
            s.nnodes = Some(args::number(name, &v)?);
        }
        "--node-rank" | "--node_rank" => s.node_rank = Some(args::number(name, &value()?)?),
        "--store" => {
            let url = value()?;
            hccn_runtime::StoreAddr::parse(&url).map_err(|e| UsageError(e.to_string()))?;
            s.store = Some(url);
        }
        "--hostfile" => {
            let path = value()?;
            let text = std::fs::read_to_string(&path).map_err(|e| UsageError(format!("--hostfile {path}: {e}")))?;
            s.hosts = Some(hostfile::parse(&text).map_err(|e| UsageError(format!("--hostfile {path}: {e}")))?);
        }
        "--remote-cmd" => s.remote_cmd = Some(value()?),
        "--bind-to" => {
            s.bind_to_core = match value()?.as_str() {
                "core" => true,
                "none" => false,
                v => return Err(UsageError(format!("--bind-to {v}: expected core or none"))),
            }
        }
        "--min-ranks" => s.min_ranks = Some(args::number(name, &value()?)?),
        "--max-restarts" => s.max_restarts = Some(args::number(name, &value()?)?),
        "-x" => s.exports.push(export(&value()?)?),
        "--output-dir" => s.output_dir = Some(PathBuf::from(value()?)),
        "--python" => s.python = Some(value()?.into()),
        "--no-python" | "--no_python" => s.no_python = true,
        "--master-addr" | "--master_addr" => s.master_addr = Some(value()?),
        "--master-port" | "--master_port" => {
            let port: u16 = args::number(name, &value()?)?;
            if port == 0 {
                return Err(UsageError(format!("{name} must be a port number from 1 to 65535")));
            }
            s.master_port = Some(port);
        }
        "--oversubscribe" | "--standalone" => {}
        _ => return Err(UsageError(format!("unknown option {name}"))),
    }
    Ok(None)
}

pub fn parse(mut a: Args) -> Result<Invocation, UsageError> {
    let mut s = Seen::default();
    while let Some((name, inline)) = a.next_option()? {
        if let Some(done) = take(&mut s, &mut a, &name, inline)? {
            return Ok(done);
        }
    }
    let slots = s.hosts.as_ref().map(|h: &Vec<Host>| h.iter().map(|h| h.slots).sum::<u32>());
    let nranks = s.nranks.or(slots).ok_or_else(|| UsageError("the number of ranks (-n N) is required".into()))?;
    let nnodes = s.nnodes.unwrap_or(1);
    if let Some(hosts) = &s.hosts {
        if nnodes > 1 {
            return Err(UsageError("--hostfile and --nnodes exclude each other".into()));
        }
        hostfile::place(hosts, nranks, 0).map_err(UsageError)?;
    }
    let node_rank = s.node_rank.unwrap_or(0);
    if nnodes == 0 || node_rank >= nnodes {
        return Err(UsageError(format!("--node-rank {node_rank} must be below --nnodes {nnodes}")));
    }
    if nnodes > 1 && s.store.is_none() {
        return Err(UsageError("--nnodes needs --store: every host's ranks must meet in one store".into()));
    }
    if s.etcd_local && s.store.is_some() {
        return Err(UsageError("--store and --etcd-local exclude each other".into()));
    }
    if !s.elastic && (s.min_ranks.is_some() || s.max_restarts.is_some()) {
        return Err(UsageError("--min-ranks and --max-restarts go with --elastic".into()));
    }
    if nranks.checked_mul(nnodes).is_none() {
        return Err(UsageError(format!("{nnodes} hosts of {nranks} ranks are too many")));
    }
    let elastic =
        s.elastic.then_some(Elastic { min_ranks: s.min_ranks.unwrap_or(1), max_restarts: s.max_restarts.unwrap_or(3) });
    let mut rest = a.rest().into_iter();
    let program = rest.next().ok_or_else(|| UsageError("no PROGRAM given".into()))?;
    Ok(Invocation::Run(Box::new(Options {
        nranks,
        timeout: s.timeout,
        grace: s.grace.unwrap_or(Duration::from_secs(3)),
        elastic,
        store: s.store,
        etcd_local: s.etcd_local,
        nnodes,
        node_rank,
        hosts: s.hosts,
        remote_cmd: s.remote_cmd.unwrap_or_else(|| DEFAULT_REMOTE.to_owned()),
        bind_to_core: s.bind_to_core,
        exports: s.exports,
        output_dir: s.output_dir,
        python: s.python,
        no_python: s.no_python,
        master_addr: s.master_addr,
        master_port: s.master_port,
        program,
        args: rest.collect(),
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(a: &[&str]) -> Result<Invocation, UsageError> {
        parse(Args::new(a.iter().copied()))
    }

    fn run_of(a: &[&str]) -> Options {
        match parse_strs(a) {
            Ok(Invocation::Run(o)) => *o,
            other => panic!("{a:?} not parsed: {other:?}"),
        }
    }

    #[test]
    fn parses_a_command_line() {
        let o = run_of(&["-n", "3", "--timeout", "1.5", "--grace=0", "--", "prog", "-n", "5"]);
        assert_eq!(o.nranks, 3);
        assert_eq!(o.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(o.grace, Duration::ZERO);
        assert_eq!(o.program, "prog");
        assert_eq!(o.args, vec![OsString::from("-n"), OsString::from("5")]);
        let o = run_of(&["-n", "1", "prog"]);
        assert_eq!(run_of(&["-np", "1", "prog"]), o, "-np is -n");
        assert_eq!(run_of(&["--nproc-per-node", "1", "prog"]), o, "--nproc-per-node is -n");
        assert_eq!(run_of(&["--nproc_per_node=1", "--oversubscribe", "--standalone", "prog"]), o);
        assert_eq!((o.timeout, o.grace, o.bind_to_core), (None, Duration::from_secs(3), false));
        assert!(run_of(&["-n", "2", "--bind-to", "core", "prog"]).bind_to_core);
        assert!(parse_strs(&["-n", "2", "--bind-to=socket", "prog"]).is_err());
        assert_eq!(parse_strs(&["--help"]), Ok(Invocation::Help));
        assert_eq!(parse_strs(&["--version", "-n", "x"]), Ok(Invocation::Version));
    }

    #[test]
    fn nproc_per_node_composes_with_nnodes() {
        let store = ["--store", "tcp://127.0.0.1:9"];
        let o = run_of(&[&store[..], &["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "3", "p"]].concat());
        assert_eq!((o.nranks, o.nnodes, o.node_rank, o.world_size()), (3, 2, 1, 6));
        let place = o.place(4).expect("rank 4 is on node 1");
        assert_eq!((place.node, place.local, place.local_size), (1, 1, 3));
        assert!(parse_strs(&[&store[..], &["--nnodes", "1:2", "-n", "1", "p"]].concat()).is_err());
    }

    #[test]
    fn exports_python_and_torchrun_settings() {
        std::env::set_var("HCCNRUN_TEST_EXPORT", "from here");
        let o = run_of(&["-n", "1", "-x", "HCCNRUN_TEST_EXPORT", "-x", "B=2=3", "--output-dir", "/tmp/o", "s.py", "a"]);
        assert_eq!(o.exports, [("HCCNRUN_TEST_EXPORT".into(), "from here".into()), ("B".into(), "2=3".into())]);
        assert_eq!(o.output_dir, Some(PathBuf::from("/tmp/o")));
        assert_eq!(o.command_line(), ("python3".into(), vec!["-u".into(), "s.py".into(), "a".into()]));
        let o = run_of(&["-n", "1", "--python", "/v/bin/python", "s.py"]);
        assert_eq!(o.command_line().0, "/v/bin/python");
        assert_eq!(run_of(&["-n", "1", "--no-python", "s.py"]).command_line().0, "s.py");
        assert_eq!(run_of(&["-n", "1", "s.pyc"]).command_line().0, "s.pyc");
        for bad in [&["-x", "HCCNRUN_TEST_UNSET_VAR"][..], &["-x", "1A=2"], &["-x", "=2"], &["--master-port", "0"]] {
            assert!(parse_strs(&[&["-n", "1"], bad, &["p"]].concat()).is_err(), "{bad:?}");
        }
        let o = run_of(&["-n", "1", "--master-addr", "10.0.0.1", "--master-port=29500", "p"]);
        assert_eq!((o.master_addr.as_deref(), o.master_port), (Some("10.0.0.1"), Some(29500)));
    }

    #[test]
    fn refuses_bad_usage() {
        for bad in
            [&["prog"][..], &["-n", "0", "prog"], &["-n", "2"], &["-n", "x", "p"], &["--timeout", "0", "-n", "1", "p"]]
        {
            assert!(parse_strs(bad).is_err(), "{bad:?}");
        }
        assert!(parse_strs(&["-n", "2", "--bogus", "p"]).is_err());
        assert!(parse_strs(&["--nproc-per-node", "auto", "p"]).is_err());
    }

    #[test]
    fn a_host_file_sets_the_world_and_excludes_nnodes() {
        let dir = std::env::temp_dir().join(format!("hccnrun-hosts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("hosts");
        std::fs::write(&file, "a slots=2\nb slots=3\n").expect("write");
        let f = file.to_string_lossy().into_owned();
        let o = run_of(&["--hostfile", &f, "p"]);
        assert_eq!((o.nranks, o.remote_cmd.as_str()), (5, DEFAULT_REMOTE));
        assert_eq!(o.place(3).map(|p| p.node), Ok(1), "the second host is node 1");
        assert!(parse_strs(&["--hostfile", &f, "-n", "6", "p"]).is_err(), "more ranks than slots");
        assert!(parse_strs(&["--hostfile", &f, "--nnodes", "2", "--store", "tcp://127.0.0.1:1", "p"]).is_err());
        assert!(parse_strs(&["--hostfile", "/nonexistent/hosts", "p"]).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
