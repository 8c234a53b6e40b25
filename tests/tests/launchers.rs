//! hccn under the launchers clusters use, with no hccnrun and no HCCN_* variable: a real one-node
//! Slurm (srun, salloc, mpirun inside an allocation), Open MPI's mpirun (by environment, through
//! PMIx, beside MPI itself, and the unique id over MPI_Bcast), MPICH's mpiexec, torchrun (one
//! host, and two network-namespace hosts), MindSpore's msrun with hccn_ms, Ascend rank tables on
//! the HCCL backend (through hccl-emu), and environments that must fail at once. Needs `cargo build --release` first and the Debian
//! packages and torch venv that scripts/setup*.sh install. Every run has a hard timeout.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use hccn_runtime::config::VARIABLES;
use hccn_tests::framework::Framework;
use hccn_tests::launch::{self, Outcome};
use hccn_tests::netlab::Lab;
use hccn_tests::scratch::{root, TempDir};
use hccn_tests::slurm::Slurm;

const T: Duration = Duration::from_secs(120);
/// Long enough that a rank which waited for anything would be killed by the test's limit first.
const NO_WAIT: &str = "600000";
const TORCHRUN: &str = "/opt/hccn/venvs/torch/bin/torchrun";
const PYTHON: &str = "/opt/hccn/venvs/torch/bin/python";

/// A command that sees none of the variables hccn reads (as a user's job would not).
fn cmd(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    for v in VARIABLES {
        c.env_remove(v.name);
    }
    c.env_remove("LD_LIBRARY_PATH");
    c
}

/// Open MPI refuses root unless told; CI runs as root.
fn mpirun() -> Command {
    let mut c = cmd("mpirun");
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c.args(["--oversubscribe", "--mca", "btl", "self,vader"]);
    c
}

fn scratch() -> &'static Path {
    static DIR: OnceLock<TempDir> = OnceLock::new();
    DIR.get_or_init(|| TempDir::new("launchers")).path()
}

/// Compiles `source` against the public header and this build's library.
fn compile(cc: &str, source: &Path, name: &str) -> PathBuf {
    let out = scratch().join(name);
    let lib = launch::bin_dir();
    let mut c = Command::new(cc);
    c.args(["-std=c99", "-O2", "-Wall", "-Werror", "-I"]).arg(root().join("include")).arg(source);
    c.arg("-L").arg(&lib).arg("-lhccn").arg(format!("-Wl,-rpath,{}", lib.display())).arg("-o").arg(&out);
    let built = launch::run(c, T);
    assert_eq!(built.code, Some(0), "{cc} {}: {}", source.display(), built.describe());
    out
}

/// examples/c/allreduce.c, built once.
fn c_example() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| compile("gcc", &root().join("examples/c/allreduce.c"), "allreduce"))
}

fn expect_all(out: &Outcome, n: u32, line: impl Fn(u32) -> String, what: &str) {
    assert_eq!(out.code, Some(0), "{what}: {}", out.describe());
    for r in 0..n {
        assert!(out.stdout.contains(&line(r)), "{what}: no {:?}: {}", line(r), out.describe());
    }
}

fn c_example_line(n: u32) -> impl Fn(u32) -> String {
    move |r| format!("rank {r} of {n}: allreduce of 1024 floats ok")
}

#[test]
fn slurm_srun_salloc_and_mpirun_in_an_allocation() {
    let slurm = Slurm::start("l");
    let prog = c_example();
    let srun = |args: &[&str]| {
        let mut c = slurm.command("srun");
        for v in VARIABLES {
            c.env_remove(v.name);
        }
        c.args(["--overcommit"]).args(args);
        c
    };
    let out = launch::run(srun(&["-n", "4", &prog.display().to_string()]), T);
    expect_all(&out, 4, c_example_line(4), &format!("srun -n 4 allreduce\n{}", slurm.logs()));

    let script = root().join("examples/launchers/allreduce.py").display().to_string();
    let lib = launch::bin_dir().join("libhccn.so").display().to_string();
    let mut py = srun(&["-n", "4", PYTHON, &script]);
    py.env("HCCN_LIB", &lib);
    expect_all(&launch::run(py, T), 4, |r| format!("rank {r} of 4: ok"), "srun -n 4 python allreduce.py");

    let info = launch::bin("hccn-info").display().to_string();
    let out = launch::run(srun(&["-n", "2", &info, "--launcher"]), T);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    for r in 0..2 {
        assert!(out.stdout.contains(&format!("[{r}] launcher: Slurm srun")), "{}", out.describe());
        assert!(
            out.stdout.contains(&format!("[{r}] rank {r} of 2, local rank {r} of 2 on node 0")),
            "{}",
            out.describe()
        );
    }
    assert!(out.stdout.contains("store: tcp://127.0.0.1:") && out.stdout.contains("the step runs on one node"));

    // The allocation's shell runs the program outside any step: refused at once, saying why.
    let mut salloc = slurm.command("salloc");
    salloc.args(["-n", "2", "--overcommit"]).arg(prog).env("HCCN_TIMEOUT_MS", NO_WAIT);
    let out = launch::run(salloc, T);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains("outside a job step") && out.stderr.contains("start the ranks with srun"),
        "{}",
        out.describe()
    );

    // mpirun inside an allocation: its ranks run under the daemon step srun started for it, and
    // follow mpirun, the innermost launcher.
    let mut with_mpirun = slurm.command("salloc");
    with_mpirun.args(["-n", "4", "--overcommit", "mpirun"]).args(mpirun().get_args()).args(["-n", "4"]).arg(prog);
    with_mpirun.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    expect_all(&launch::run(with_mpirun, T), 4, c_example_line(4), "salloc mpirun -n 4 allreduce");
}

/// The `meeting` line of rank `r` (HCCN_LOG=info).
fn meeting(out: &Outcome, r: u32) -> String {
    let tag = format!("rank={r} ");
    out.stderr.lines().find(|l| l.contains(&tag) && l.contains(" meeting ")).unwrap_or_default().to_owned()
}

#[test]
fn mpirun_by_pmix_by_environment_beside_mpi_and_by_unique_id() {
    let prog = c_example();
    let mut pmix = mpirun();
    pmix.args(["-n", "4", "-x", "HCCN_LOG"]).arg(prog).env("HCCN_LOG", "info");
    let out = launch::run(pmix, T);
    expect_all(&out, 4, c_example_line(4), "mpirun -n 4 allreduce");
    assert!((0..4).all(|r| meeting(&out, r).contains("via=\"PMIx\"")), "through PMIx: {}", out.describe());

    let mut env = mpirun();
    env.args(["-n", "4", "-x", "HCCN_LOG", "-x", "HCCN_PMIX"])
        .arg(prog)
        .env("HCCN_LOG", "info")
        .env("HCCN_PMIX", "off");
    let out = launch::run(env, T);
    expect_all(&out, 4, c_example_line(4), "HCCN_PMIX=off mpirun -n 4 allreduce");
    assert!((0..4).all(|r| meeting(&out, r).contains("via=\"the launcher's address\"")), "{}", out.describe());
    assert!(meeting(&out, 0).contains("store=tcp://127.0.0.1:2"), "a derived port: {}", out.describe());

    // MPI in the same process shares mpirun's PMIx connection, whichever initializes first, a
    // program that never destroys its communicator still ends well under mpirun, and a process
    // makes several worlds (two at once, then another).
    let both = worlds_program();
    for mode in ["mpi-first", "hccn-first", "no-destroy", "worlds"] {
        let mut c = mpirun();
        c.args(["-n", "3"]).arg(both).arg(mode);
        expect_all(&launch::run(c, T), 3, |r| format!("[{r}] {mode}: rank {r} of 3 ok"), mode);
    }

    // MPICH's Hydra: PMI_RANK, PMI_SIZE, MPI_LOCALNRANKS; one host, on loopback.
    let mut c = cmd("mpiexec.mpich");
    c.args(["-n", "3"]).arg(prog).env("HCCN_LOG", "info");
    let out = launch::run(c, T);
    expect_all(&out, 3, c_example_line(3), "mpiexec.mpich -n 3 allreduce");
    assert!(meeting(&out, 1).contains("MPICH/Hydra"), "{}", out.describe());

    // The NCCL way: a unique id sent with MPI_Bcast, hccn_comm_init_rank.
    let uid = compile("mpicc", &root().join("examples/launchers/unique_id_mpi.c"), "unique_id_mpi");
    let mut c = mpirun();
    c.args(["-n", "4"]).arg(uid);
    expect_all(&launch::run(c, T), 4, |r| format!("rank {r} of 4: unique id over MPI_Bcast: ok"), "unique id");
}

fn torchrun() -> Command {
    assert!(Path::new(TORCHRUN).exists(), "{TORCHRUN} is missing: run `bash scripts/setup-python.sh torch`");
    cmd(TORCHRUN)
}

/// A port for torchrun's `--master-port` (or msrun's `--master_port`) whose hccn store port
/// (+53) is free too: a free port's neighbour 53 above may be another test's at that moment.
fn master_port() -> String {
    let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
    let port = (0..200)
        .filter_map(|_| std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok())
        .map(|a| a.port())
        .find(|&p| p < u16::MAX - 53 && free(p + 53))
        .expect("a free port pair");
    port.to_string()
}

#[test]
fn torchrun_starts_a_c_program() {
    let mut c = torchrun();
    c.args(["--nproc-per-node", "3", "--no-python", "--master-port", &master_port()]).arg(c_example());
    expect_all(&launch::run(c, T), 3, c_example_line(3), "torchrun --nproc-per-node 3 --no-python allreduce");
    // Several worlds in a process meet in the one store rank 0 keeps at MASTER_PORT+53.
    let mut c = torchrun();
    c.args(["--nproc-per-node", "3", "--no-python", "--master-port", &master_port()])
        .arg(worlds_program())
        .arg("worlds");
    expect_all(&launch::run(c, T), 3, |r| format!("[{r}] worlds: rank {r} of 3 ok"), "torchrun: three worlds");
}

fn worlds_program() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| compile("mpicc", &root().join("tests/src/c/mpi_and_hccn.c"), "mpi_and_hccn"))
}

#[test]
fn two_namespace_hosts_each_run_torchrun_and_meet_on_host_0() {
    let lab = Lab::new("tr", 2);
    let master = lab.addr(0);
    let threads: Vec<_> = (0..2)
        .map(|i| {
            let mut c = cmd("ip");
            c.args(["netns", "exec", &lab.hosts[i], "unshare", "--uts", "sh", "-c"])
                .arg(format!("hostname host{i} && exec \"$0\" \"$@\""))
                .arg(TORCHRUN)
                .args(["--nnodes", "2", "--node-rank", &i.to_string(), "--nproc-per-node", "2"])
                .args(["--master-addr", &master, "--master-port", "29500", "--no-python"])
                .arg(c_example())
                .env("HCCN_LOG", "info");
            std::thread::spawn(move || launch::run(c, T))
        })
        .collect();
    let outs: Vec<Outcome> = threads.into_iter().map(|t| t.join().expect("a host's torchrun")).collect();
    for (i, out) in outs.iter().enumerate() {
        expect_all(out, 0, |_| String::new(), &format!("host {i}"));
        for local in 0..2 {
            let r = 2 * i as u32 + local;
            assert!(out.stdout.contains(&c_example_line(4)(r)), "host {i}, rank {r}: {}", out.describe());
            assert!(meeting(out, r).contains(&format!("store=tcp://{master}:29553")), "{}", out.describe());
        }
    }
    // The ranks of host 1 reached host 0 over the bridge, not over loopback.
    assert!(outs[1].stderr.contains("rank=2 peer=0 transport=\"tcp\""), "{}", outs[1].describe());
}

/// Starts `n` processes of `program` at once, each with `env(rank)`, and collects them.
fn each_rank(n: u32, program: &Path, env: impl Fn(u32) -> Vec<(String, String)>) -> Vec<Outcome> {
    let threads: Vec<_> = (0..n)
        .map(|r| {
            let mut c = cmd(program);
            c.envs(env(r));
            std::thread::spawn(move || launch::run(c, T))
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("a rank")).collect()
}

#[test]
fn rank_tables_1_0_and_1_2_drive_the_hccl_backend() {
    let emu = launch::bin_dir().join("libhccl_emu.so");
    assert!(emu.exists(), "{} is missing: cargo build --release", emu.display());
    let devices = |extra: &str| {
        (0..3)
            .map(|r| format!(r#"{{"device_id":"{}","device_ip":"192.168.1.{r}",{extra}"rank_id":"{r}"}}"#, r + 4))
            .collect::<Vec<_>>()
            .join(",")
    };
    let v10 = format!(
        r#"{{"version":"1.0","status":"completed","server_count":"1","server_list":[{{"server_id":"127.0.0.1","device":[{}]}}]}}"#,
        devices("")
    );
    let v12 = format!(
        r#"{{"version":"1.2","status":"completed","server_count":"1","server_list":[{{"server_id":"node-a","host_ip":"127.0.0.1","device":[{}]}}],"super_pod_list":[{{"super_pod_id":"0","server_list":[{{"server_id":"node-a"}}]}}]}}"#,
        devices(r#""super_device_id":"3774873","#)
    );
    for (version, table) in [("1.0", v10), ("1.2", v12)] {
        let path = scratch().join(format!("hccl-{version}.json"));
        std::fs::write(&path, table).expect("write the rank table");
        let outs = each_rank(3, c_example(), |r| {
            [
                ("RANK_TABLE_FILE", path.display().to_string()),
                ("RANK_ID", r.to_string()),
                ("HCCN_BACKEND", "hccl".into()),
                ("HCCN_HCCL_LIB", emu.display().to_string()),
                ("HCCN_ACL_LIB", emu.display().to_string()),
                ("HCCN_LOG", "info".into()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect()
        });
        for (r, out) in outs.iter().enumerate() {
            let r = r as u32;
            expect_all(out, 0, |_| String::new(), &format!("rank table {version}, rank {r}"));
            assert!(out.stdout.contains(&c_example_line(3)(r)), "{version}: {}", out.describe());
            let loaded = out.stderr.lines().find(|l| l.contains("HCCL backend loaded")).unwrap_or_default();
            assert!(loaded.contains(&format!("device={}", r + 4)), "{version}: the table's device_id: {loaded:?}");
        }
    }
}

/// Runs the C example in `env` alone (no launcher around it): it must fail at once with a
/// message holding every one of `needles`.
fn refused_at_once(env: &[(&str, &str)], needles: &[&str]) {
    let mut c = cmd(c_example());
    c.envs(env.iter().copied()).env("HCCN_TIMEOUT_MS", NO_WAIT);
    let out = launch::run(c, Duration::from_secs(60));
    assert_eq!(out.code, Some(1), "{env:?}: {}", out.describe());
    for n in needles {
        assert!(out.stderr.contains(n), "{env:?}: no {n:?}: {}", out.describe());
    }
}

#[test]
fn bad_environments_fail_at_once_naming_what_to_set() {
    refused_at_once(&[], &["no launcher found", "srun", "mpirun", "torchrun", "HCCN_STORE"]);
    // A batch script's Slurm variables: the allocation's, not a step's.
    let batch = [("SLURM_JOB_ID", "7"), ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4")];
    refused_at_once(&batch, &["outside a job step", "srun"]);
    refused_at_once(&[("SLURM_JOB_ID", "7"), ("SLURM_STEP_ID", "0"), ("SLURM_NTASKS", "4")], &["SLURM_PROCID"]);
    // Two launchers, one left over: Slurm's step says rank 1 of 2, Open MPI's rank 0 of 2.
    let step = [("SLURM_JOB_ID", "7"), ("SLURM_STEP_ID", "0"), ("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")];
    let both = [&step[..], &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")]].concat();
    refused_at_once(&both, &["conflicting launchers", "rank 0 of 2", "rank 1 of 2"]);
    let stale =
        [&step[..], &[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "1")]].concat();
    refused_at_once(&stale, &["conflicting launchers", "torchrun"]);
    // A rank table without RANK_ID, or with one it does not hold.
    let table = scratch().join("bad-env.json");
    std::fs::write(&table, std::fs::read(root().join("examples/launchers/hccl.json")).expect("the example table"))
        .expect("write");
    let t = table.display().to_string();
    refused_at_once(&[("RANK_TABLE_FILE", &t)], &["RANK_ID is not", "0..4"]);
    refused_at_once(&[("RANK_TABLE_FILE", &t), ("RANK_ID", "4")], &["RANK_ID=4 is not in"]);
    refused_at_once(&[("RANK_TABLE_FILE", "/nonexistent/hccl.json"), ("RANK_ID", "0")], &["cannot read"]);
    // The port rank 0 would host the store on is taken: rank 0 says so, and what to set.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = taken.local_addr().expect("its address").port();
    let master = (port - 53).to_string();
    let torch = [("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", master.as_str())];
    refused_at_once(&torch, &["rank 0 cannot host the store", "the port is taken", "HCCN_STORE"]);
    drop(taken);
    // msrun's scheduler process is no rank.
    refused_at_once(&[("MS_ROLE", "MS_SCHED"), ("MS_WORKER_NUM", "2")], &["scheduler", "not a rank"]);
}

#[test]
fn hccn_info_alone_is_a_world_of_one() {
    let out = launch::run(cmd(launch::bin("hccn-info")), T);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stdout.starts_with("# hccn-info: 1 ranks on 1 host(s)"), "{}", out.describe());
    assert!(out.stdout.contains("\n# launcher: none found"), "{}", out.describe());
    let mut c = cmd(launch::bin("hccn-info"));
    c.arg("--launcher").envs([
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ]);
    let out = launch::run(c, T);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stdout.contains("[1] launcher: torchrun") && out.stdout.contains("[1] store: tcp://127.0.0.1:29553"));
}

#[test]
fn pmix_layouts_match_the_installed_header() {
    let src = scratch().join("pmix_layout.c");
    std::fs::write(
        &src,
        "#include <pmix.h>\n#include <stdio.h>\nint main(void) { printf(\"%zu %zu %zu\", sizeof(pmix_proc_t), \
         sizeof(pmix_value_t), sizeof(pmix_info_t)); return 0; }\n",
    )
    .expect("write");
    let exe = scratch().join("pmix_layout");
    let flags = Command::new("pkg-config").args(["--cflags", "pmix"]).output().expect("pkg-config");
    let mut c = Command::new("gcc");
    c.args(String::from_utf8_lossy(&flags.stdout).split_whitespace()).arg(&src).arg("-o").arg(&exe);
    let built = launch::run(c, T);
    assert_eq!(built.code, Some(0), "pmix.h (libpmix-dev, scripts/setup.sh): {}", built.describe());
    let out = launch::run(Command::new(&exe), T);
    let want = hccn_runtime::rendezvous::pmix::LAYOUT.map(|s| s.to_string()).join(" ");
    assert_eq!(out.stdout, want, "pmix_proc_t, pmix_value_t, pmix_info_t");
}

#[test]
fn msrun_workers_run_mindspore_over_hccn_and_its_scheduler_steps_aside() {
    let venv = "/opt/hccn/venvs/mindspore/bin";
    let ms = Framework {
        python: "/opt/hccn/venvs/mindspore/bin/python",
        dir: "mindspore",
        build_args: &["--interface-test"],
        build_timeout: Duration::from_secs(300),
        env: &[],
    };
    let logs = scratch().join("msrun-logs");
    // hccn's store goes 53 above msrun's scheduler port, as with torchrun.
    let port = master_port();
    let mut c = cmd(format!("{venv}/msrun"));
    c.args(["--worker_num", "2", "--local_worker_num", "2", "--join", "True", "--master_port", &port])
        .arg("--log_dir")
        .arg(&logs)
        .arg(root().join("examples/launchers/ms_allreduce.py"))
        // msrun starts `python` from PATH.
        .env("PATH", format!("{venv}:{}", std::env::var("PATH").unwrap_or_default()))
        .env("PYTHONPATH", ms.built())
        .env("GLOG_v", "3");
    let out = launch::run(c, Duration::from_secs(300));
    let log = |f: &str| std::fs::read_to_string(logs.join(f)).unwrap_or_default();
    let all = format!("{}\n{}\n{}", log("scheduler.log"), log("worker_0.log"), log("worker_1.log"));
    assert_eq!(out.code, Some(0), "{}\n{all}", out.describe());
    for r in 0..2 {
        assert!(log(&format!("worker_{r}.log")).contains(&format!("[msrun] rank {r} of 2: ok")), "{all}");
    }
    assert!(log("scheduler.log").contains("msrun's scheduler process is not needed"), "{all}");
}
