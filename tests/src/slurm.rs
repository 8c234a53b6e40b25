//! A real one-node Slurm for tests: Debian's munged, slurmctld and slurmd (installed by
//! scripts/setup.sh) on a generated slurm.conf with ports, state and spool of its own,
//! `proctrack/linuxproc` and `task/none` (no cgroups needed) and `OverSubscribe=FORCE`, so that
//! `srun -n 4 --overcommit` fits on any machine. Started for one test, stopped by pid when it
//! drops (a failed test keeps its directory, logs included, for a look).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::scratch::TempDir;

#[derive(Debug)]
pub struct Slurm {
    dir: TempDir,
    conf: PathBuf,
    /// munged, slurmctld, slurmd: stopped in reverse order.
    daemons: Vec<Child>,
}

/// The node's name in slurm.conf: one that resolves nowhere, as on clusters whose node names
/// only Slurm knows (NodeAddr says where it is).
pub const NODE: &str = "hccnnode";

const READY: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

fn short_hostname() -> String {
    let out = Command::new("hostname").arg("-s").output().expect("run hostname");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn daemon(cmd: &mut Command, log: &Path) -> Child {
    let out = std::fs::File::create(log).expect("a log file");
    let err = out.try_clone().expect("a log file");
    cmd.stdin(Stdio::null()).stdout(out).stderr(err).spawn().unwrap_or_else(|e| {
        panic!("cannot start {cmd:?} ({e}): scripts/setup.sh installs slurmctld, slurmd, slurm-client and munge")
    })
}

impl Slurm {
    /// Starts munged, slurmctld and slurmd and waits until the node is idle.
    pub fn start(tag: &str) -> Slurm {
        let dir = TempDir::new(&format!("slurm-{tag}"));
        let d = dir.path().to_path_buf();
        for sub in ["state", "spool", "munge"] {
            std::fs::create_dir_all(d.join(sub)).expect("slurm dirs");
        }
        let mut key = vec![0u8; 1024];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").expect("/dev/urandom"), &mut key)
            .expect("random bytes");
        let key_file = d.join("munge/munge.key");
        std::fs::write(&key_file, key).expect("munge key");
        set_mode(&key_file, 0o600);
        set_mode(&d.join("munge"), 0o711);
        let socket = d.join("munge/socket");
        let mut daemons = Vec::new();
        let mut munged = Command::new("munged");
        munged.args(["-F", "-f"]).arg(format!("--socket={}", socket.display()));
        munged.arg(format!("--key-file={}", key_file.display()));
        for (flag, file) in [("--log-file", "munged.log"), ("--pid-file", "munged.pid"), ("--seed-file", "munged.seed")]
        {
            munged.arg(format!("{flag}={}", d.join("munge").join(file).display()));
        }
        daemons.push(daemon(&mut munged, &d.join("munged.out")));
        let conf = d.join("slurm.conf");
        std::fs::write(&conf, slurm_conf(&d, &socket)).expect("slurm.conf");
        let mut slurm = Slurm { dir, conf, daemons };
        slurm.wait_for(|| socket.exists(), "munged's socket");
        let conf = slurm.conf.display().to_string();
        let ctld = daemon(Command::new("slurmctld").args(["-D", "-i", "-f", &conf]), &d.join("slurmctld.out"));
        slurm.daemons.push(ctld);
        let slurmd = daemon(Command::new("slurmd").args(["-D", "-f", &conf, "-N", NODE]), &d.join("slurmd.out"));
        slurm.daemons.push(slurmd);
        let conf = slurm.conf.clone();
        slurm.wait_for(|| node_state(&conf).starts_with("idle"), "the node to be idle");
        slurm
    }

    fn wait_for(&mut self, ready: impl Fn() -> bool, what: &str) {
        let start = Instant::now();
        while !ready() {
            for d in &mut self.daemons {
                if let Ok(Some(st)) = d.try_wait() {
                    panic!("a Slurm daemon exited ({st}) while waiting for {what}: {}", self.logs());
                }
            }
            assert!(start.elapsed() < READY, "no {what} after {READY:?}: {}", self.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A Slurm client command (`srun`, `salloc`, `sbatch`, `sinfo`) of this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("SLURM_CONF", &self.conf);
        cmd
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The daemons' logs, for failure messages.
    pub fn logs(&self) -> String {
        ["munged.out", "slurmctld.out", "slurmctld.log", "slurmd.out", "slurmd.log"]
            .iter()
            .map(|f| format!("--- {f} ---\n{}", std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        for d in self.daemons.iter_mut().rev() {
            // SAFETY: signalling a child this fixture started, by its pid; harmless if gone.
            unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
            let start = Instant::now();
            while matches!(d.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

fn node_state(conf: &Path) -> String {
    let out = Command::new("sinfo").env("SLURM_CONF", conf).args(["-h", "-n", NODE, "-o", "%t"]).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default()
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn slurm_conf(d: &Path, munge: &Path) -> String {
    let p = |f: &str| d.join(f).display().to_string();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!(
        "ClusterName=hccntest\n\
         SlurmctldHost={host}(127.0.0.1)\n\
         SlurmctldPort={ctld}\n\
         SlurmdPort={slurmd}\n\
         AuthType=auth/munge\n\
         AuthInfo=socket={munge}\n\
         CredType=cred/munge\n\
         SlurmUser=root\n\
         SlurmdUser=root\n\
         StateSaveLocation={state}\n\
         SlurmdSpoolDir={spool}\n\
         SlurmctldPidFile={ctld_pid}\n\
         SlurmdPidFile={d_pid}\n\
         SlurmctldLogFile={ctld_log}\n\
         SlurmdLogFile={d_log}\n\
         ProctrackType=proctrack/linuxproc\n\
         TaskPlugin=task/none\n\
         SchedulerType=sched/builtin\n\
         SelectType=select/cons_tres\n\
         SelectTypeParameters=CR_Core\n\
         MpiDefault=none\n\
         ReturnToService=2\n\
         MailProg=/bin/true\n\
         JobCompType=jobcomp/none\n\
         AccountingStorageType=accounting_storage/none\n\
         NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname=localhost CPUs={cpus} State=UNKNOWN\n\
         PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE\n",
        host = short_hostname(),
        ctld = free_port(),
        slurmd = free_port(),
        munge = munge.display(),
        state = p("state"),
        spool = p("spool"),
        ctld_pid = p("slurmctld.pid"),
        d_pid = p("slurmd.pid"),
        ctld_log = p("slurmctld.log"),
        d_log = p("slurmd.log"),
    )
}
