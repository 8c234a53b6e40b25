//! The detection table without processes: environments as launchers make them (read from real
//! srun, sbatch, mpirun and torchrun runs), and the mixtures real clusters produce.

use super::*;
use crate::config::VARIABLES;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

type Env = &'static [(&'static str, &'static str)];

fn detect_with(env: &[(&str, &str)], seen: &RefCell<BTreeSet<String>>) -> Result<LaunchEnv> {
    let m: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    LaunchEnv::from_lookup(|k| {
        seen.borrow_mut().insert(k.to_owned());
        m.get(k).cloned()
    })
}

fn detect(env: &[(&str, &str)]) -> Result<LaunchEnv> {
    detect_with(env, &RefCell::default())
}

fn ok(env: &[(&str, &str)]) -> LaunchEnv {
    detect(env).unwrap_or_else(|e| panic!("{env:?}: {e}"))
}

fn refused(env: &[(&str, &str)], needles: &[&str]) {
    let e = detect(env).err().unwrap_or_else(|| panic!("{env:?} was accepted")).to_string();
    for n in needles {
        assert!(e.contains(n), "{env:?}: {e:?} lacks {n:?}");
    }
}

fn rank0(dial: &str) -> Meet {
    let dial: SocketAddr = dial.parse().expect("an address");
    Meet::Rank0 { dial, listen: dial }
}

const SRUN_ONE_NODE: Env = &[
    ("SLURM_JOB_ID", "12"),
    ("SLURM_STEP_ID", "0"),
    ("SLURM_PROCID", "2"),
    ("SLURM_NTASKS", "4"),
    ("SLURM_LOCALID", "2"),
    ("SLURM_NODEID", "0"),
    ("SLURM_STEP_NODELIST", "hccnnode"),
    ("SLURM_STEP_TASKS_PER_NODE", "4"),
];
const SRUN_TWO_NODES: Env = &[
    ("SLURM_JOB_ID", "12"),
    ("SLURM_STEP_ID", "3"),
    ("SLURM_PROCID", "5"),
    ("SLURM_NTASKS", "6"),
    ("SLURM_LOCALID", "1"),
    ("SLURM_NODEID", "1"),
    ("SLURM_STEP_NODELIST", "10.0.0.[7-8]"),
    ("SLURM_STEP_TASKS_PER_NODE", "4,2"),
];
/// An sbatch script (or salloc shell): the allocation's numbers, no step.
const BATCH: Env = &[("SLURM_JOB_ID", "13"), ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4"), ("SLURM_LOCALID", "0")];
/// Open MPI's orted, started by srun for mpirun inside an allocation: a step of one task.
const ORTED_STEP: Env = &[
    ("SLURM_JOB_ID", "13"),
    ("SLURM_STEP_ID", "0"),
    ("SLURM_PROCID", "0"),
    ("SLURM_NTASKS", "1"),
    ("SLURM_NODEID", "0"),
    ("SLURM_STEP_NODELIST", "hccnnode"),
    ("SLURM_STEP_TASKS_PER_NODE", "1"),
];
const MPIRUN: Env = &[
    ("OMPI_COMM_WORLD_RANK", "1"),
    ("OMPI_COMM_WORLD_SIZE", "4"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
    ("OMPI_MCA_ess_base_jobid", "1463353345"),
    ("PMIX_NAMESPACE", "1463353345"),
    ("PMIX_RANK", "1"),
];
const TORCHRUN: Env = &[
    ("RANK", "1"),
    ("WORLD_SIZE", "3"),
    ("LOCAL_RANK", "1"),
    ("LOCAL_WORLD_SIZE", "3"),
    ("GROUP_RANK", "0"),
    ("MASTER_ADDR", "127.0.0.1"),
    ("MASTER_PORT", "29500"),
    ("TORCHELASTIC_RUN_ID", "c4655ad1"),
];
const MSRUN: Env = &[
    ("MS_ROLE", "MS_WORKER"),
    ("MS_WORKER_NUM", "4"),
    ("MS_NODE_ID", "3"),
    ("RANK_ID", "3"),
    ("MS_SCHED_HOST", "127.0.0.1"),
    ("MS_SCHED_PORT", "8118"),
];

fn with(
    base: &[(&'static str, &'static str)],
    more: &[(&'static str, &'static str)],
) -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<_> = base.iter().filter(|(k, _)| !more.iter().any(|(m, _)| m == k)).copied().collect();
    v.extend_from_slice(more);
    v
}

#[test]
fn each_launcher_alone() {
    let e = ok(TORCHRUN);
    assert_eq!((e.launcher, e.rank, e.world_size, e.local_rank, e.local_world_size), (Launcher::Torchrun, 1, 3, 1, 3));
    assert_eq!(e.meet, rank0("127.0.0.1:29553"), "MASTER_PORT + {PORT_OFFSET}");
    assert_eq!(ok(&with(TORCHRUN, &[("MASTER_PORT", "65500")])).meet, rank0("127.0.0.1:65447"), "wraps below");

    let e = ok(SRUN_ONE_NODE);
    assert_eq!((e.launcher, e.rank, e.world_size, e.local_rank, e.local_world_size), (Launcher::Slurm, 2, 4, 2, 4));
    let port = derived_port("12.0");
    assert!((20000..30000).contains(&port));
    assert_eq!(e.meet, rank0(&format!("127.0.0.1:{port}")), "one node: loopback, whatever the node's name");
    let e = ok(SRUN_TWO_NODES);
    assert_eq!((e.rank, e.local_rank, e.local_world_size, e.node), (5, 1, 2, Some(1)));
    assert_eq!(e.meet, rank0(&format!("10.0.0.7:{}", derived_port("12.3"))), "the step's first node");
    assert_ne!(derived_port("12.3"), derived_port("12.4"));

    let e = ok(MPIRUN);
    assert_eq!((e.launcher, e.rank, e.world_size), (Launcher::OpenMpi, 1, 4));
    let loopback = rank0(&format!("127.0.0.1:{}", derived_port("1463353345")));
    assert_eq!(e.meet, Meet::Pmix { single_node: true, fallback: Some(Box::new(loopback.clone())) });
    assert_eq!(ok(&with(MPIRUN, &[("HCCN_PMIX", "off")])).meet, loopback, "by environment");

    let e = ok(MSRUN);
    assert_eq!((e.launcher, e.rank, e.world_size), (Launcher::Msrun, 3, 4));
    assert_eq!(e.meet, rank0("127.0.0.1:8171"));

    let hydra =
        [("PMI_RANK", "2"), ("PMI_SIZE", "3"), ("MPI_LOCALRANKID", "2"), ("MPI_LOCALNRANKS", "3"), ("PMI_JOBID", "7")];
    let e = ok(&hydra);
    assert_eq!((e.launcher, e.rank, e.local_world_size), (Launcher::Pmi, 2, 3));
    assert_eq!(e.meet, rank0(&format!("127.0.0.1:{}", derived_port("7"))));

    // Kubeflow's PyTorchJob without torchrun, or ranks started by hand: where they run is unknown,
    // so loopback is no mistake.
    let e = ok(&[("RANK", "2"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "10.1.2.3"), ("MASTER_PORT", "23456")]);
    assert_eq!((e.local_rank, e.local_world_size), (2, 4));
    assert_eq!(e.meet, rank0("10.1.2.3:23509"));
    assert_eq!(ok(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "localhost"), ("MASTER_PORT", "1")]).rank, 1);
}

#[test]
fn hccn_variables_win_and_hccn_store_overrides() {
    let hccnrun =
        with(TORCHRUN, &[("HCCN_RANK", "1"), ("HCCN_WORLD_SIZE", "3"), ("HCCN_STORE", "tcp://127.0.0.1:2000")]);
    let e = ok(&hccnrun);
    assert_eq!((e.launcher, e.rank), (Launcher::Hccn, 1));
    assert!(e.job_token.is_empty() && !e.token_given, "no HCCN_JOB_TOKEN: the empty token, as before");
    assert_eq!(ok(&with(&hccnrun, &[("HCCN_JOB_TOKEN", "s")])).job_token, b"s");
    assert_eq!(ok(TORCHRUN).job_token, b"hccn/torchrun/29500/c4655ad1", "derived from the job");
    assert_eq!(e.meet, Meet::Store(StoreAddr::Tcp("127.0.0.1:2000".parse().expect("addr"))));
    // Even where another launcher disagrees: set by hand, HCCN_* is what the user means.
    assert_eq!(ok(&with(&hccnrun, &[("HCCN_RANK", "0")])).rank, 0);
    let e = ok(&with(SRUN_ONE_NODE, &[("HCCN_STORE", "tcp://127.0.0.1:2001")]));
    assert_eq!((e.launcher, e.rank), (Launcher::Slurm, 2));
    assert_eq!(e.meet, Meet::Store(StoreAddr::Tcp("127.0.0.1:2001".parse().expect("addr"))));
    refused(&[("HCCN_RANK", "0")], &["HCCN_WORLD_SIZE is not"]);
    refused(&[("HCCN_RANK", "0"), ("HCCN_WORLD_SIZE", "1")], &["HCCN_STORE is not set"]);
    refused(&[("HCCN_RANK", "2"), ("HCCN_WORLD_SIZE", "2"), ("HCCN_STORE", "tcp://127.0.0.1:1")], &["not below"]);
}

#[test]
fn nested_launchers_pick_the_innermost() {
    // mpirun in a batch script: the script's Slurm variables describe no step.
    assert_eq!(ok(&with(BATCH, MPIRUN)).launcher, Launcher::OpenMpi);
    // mpirun's ranks under the orted that srun started: a one-task step.
    let e = ok(&with(ORTED_STEP, MPIRUN));
    assert_eq!((e.launcher, e.rank), (Launcher::OpenMpi, 1));
    assert!(e.also.iter().any(|a| a.contains("Slurm")), "{:?}", e.also);
    // torchrun per node inside srun: the step's task is the agent (another rank is nesting).
    let agents = with(SRUN_ONE_NODE, &[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "3"), ("SLURM_LOCALID", "1")]);
    let agents = with(&with(&agents, &[("SLURM_STEP_TASKS_PER_NODE", "3")]), TORCHRUN);
    let e = ok(&agents);
    assert_eq!((e.launcher, e.rank), (Launcher::Torchrun, 1));
    let e = ok(&with(&agents, &[("RANK", "2"), ("LOCAL_RANK", "2")]));
    assert_eq!(e.rank, 2, "torchrun's own run id vouches for it");
    // The same processes seen twice (an MPI library that exports its numbers under srun).
    let same = with(SRUN_ONE_NODE, &[("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "4")]);
    let e = ok(&same);
    assert_eq!((e.launcher, e.rank), (Launcher::OpenMpi, 2));
    assert_eq!(e.meet, rank0(&format!("127.0.0.1:{}", derived_port("12.0"))), "the step's meeting point");
    // msrun per node inside srun.
    assert_eq!(ok(&with(ORTED_STEP, MSRUN)).launcher, Launcher::Msrun);
}

#[test]
fn conflicts_and_leftovers_are_refused_naming_both() {
    // Another rank for the same processes.
    let two = with(SRUN_ONE_NODE, &[("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "4")]);
    refused(
        &two,
        &["conflicting launchers", "Open MPI mpirun says rank 3 of 4", "Slurm srun says rank 2 of 4", "job step 12.0"],
    );
    // A leftover RANK/WORLD_SIZE under srun: the step started more processes than that world has.
    let stale = with(SRUN_ONE_NODE, &[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]);
    refused(&stale, &["conflicting launchers", "rank 0 of 1", "rank 2 of 4", "HCCN_RANK"]);
    // torchrun's numbers without its run id and another rank at the same size.
    let unvouched: Vec<_> =
        with(SRUN_ONE_NODE, TORCHRUN).into_iter().filter(|(k, _)| *k != "TORCHELASTIC_RUN_ID").collect();
    let unvouched = with(&with(&unvouched, &[("WORLD_SIZE", "4")]), &[("LOCAL_WORLD_SIZE", "4")]);
    refused(&unvouched, &["conflicting launchers"]);
}

#[test]
fn partial_and_empty_environments_say_what_to_set() {
    refused(&[], &["no launcher found", "srun", "mpirun", "torchrun", "HCCN_STORE"]);
    refused(BATCH, &["outside a job step", "start the ranks with srun", "job 13"]);
    refused(&[("SLURM_JOB_ID", "1"), ("SLURM_STEP_ID", "0")], &["SLURM_PROCID or SLURM_NTASKS is not set"]);
    refused(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")], &["SLURM_JOB_ID is not"]);
    refused(&with(SRUN_ONE_NODE, &[("SLURM_STEP_TASKS_PER_NODE", "3")]), &["counts 3 tasks, SLURM_NTASKS 4"]);
    refused(&with(SRUN_TWO_NODES, &[("SLURM_STEP_NODELIST", "n[1-3]")]), &["different numbers of nodes"]);
    refused(&with(SRUN_ONE_NODE, &[("SLURM_STEP_NODELIST", "n[1-")]), &["unbalanced"]);
    refused(&with(SRUN_ONE_NODE, &[("SLURM_PROCID", "4")]), &["not below"]);
    refused(&[("RANK", "0")], &["WORLD_SIZE is not"]);
    refused(&[("RANK", "0"), ("WORLD_SIZE", "2")], &["MASTER_ADDR or MASTER_PORT is not"]);
    refused(&with(TORCHRUN, &[("MASTER_PORT", "70000")]), &["MASTER_PORT=70000 is not a port"]);
    refused(&with(TORCHRUN, &[("RANK", "x")]), &["RANK=\"x\" is not a rank"]);
    // A world on several hosts told to meet on loopback.
    refused(&with(TORCHRUN, &[("WORLD_SIZE", "6")]), &["this host only", "several hosts"]);
    let multi_mpi = with(MPIRUN, &[("OMPI_COMM_WORLD_LOCAL_SIZE", "2"), ("HCCN_PMIX", "off")]);
    refused(&multi_mpi, &["several hosts and no PMIx", "HCCN_STORE"]);
    refused(&with(MPIRUN, &[("HCCN_PMIX", "sometimes")]), &["HCCN_PMIX=\"sometimes\""]);
    refused(&with(MSRUN, &[("MS_ROLE", "MS_SCHED")]), &["msrun's scheduler", "not a rank"]);
    let no_rank: Vec<_> = MSRUN.iter().filter(|(k, _)| !matches!(*k, "MS_NODE_ID" | "RANK_ID")).copied().collect();
    refused(&no_rank, &["--node_rank"]);
}

#[test]
fn several_nodes_under_pmix_keep_the_node_list_as_fallback() {
    let e = ok(&with(SRUN_TWO_NODES, &[("PMIX_RANK", "5"), ("PMIX_NAMESPACE", "slurm.pmix.12.3")]));
    let first = rank0(&format!("10.0.0.7:{}", derived_port("12.3")));
    assert_eq!(e.meet, Meet::Pmix { single_node: false, fallback: Some(Box::new(first)) });
    // One node needs no PMIx.
    let e = ok(&with(SRUN_ONE_NODE, &[("PMIX_RANK", "2"), ("PMIX_NAMESPACE", "slurm.pmix.12.0")]));
    assert!(matches!(e.meet, Meet::Rank0 { .. }), "{:?}", e.meet);
    // HCCN_BIND_ADDR moves where rank 0 listens, not where the others dial.
    let e = ok(&with(SRUN_TWO_NODES, &[("HCCN_BIND_ADDR", "0.0.0.0")]));
    let Meet::Rank0 { dial, listen } = e.meet else { panic!("{:?}", e.meet) };
    assert_eq!(
        (dial.ip().to_string(), listen.ip().to_string(), listen.port()),
        ("10.0.0.7".into(), "0.0.0.0".into(), dial.port())
    );
    assert!(e.bind_given);
}

fn table_file(name: &str, text: &str) -> String {
    let dir = std::env::temp_dir().join(format!("hccn-ranktable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write the table");
    p.display().to_string()
}

#[test]
fn rank_tables_give_rank_size_device_and_server() {
    let one = r#"{"version":"1.0","status":"completed","server_count":"1","server_list":[{"server_id":"10.9.9.9",
        "device":[{"device_id":"4","device_ip":"x","rank_id":"0"},{"device_id":"5","device_ip":"x","rank_id":"1"}]}]}"#;
    let path = table_file("one.json", one);
    let e = ok(&[("RANK_TABLE_FILE", &path), ("RANK_ID", "1")]);
    assert_eq!((e.launcher, e.rank, e.world_size, e.local_rank, e.device_id), (Launcher::RankTable, 1, 2, 1, Some(5)));
    let Meet::Rank0 { dial, .. } = e.meet else { panic!("{:?}", e.meet) };
    assert_eq!(dial.ip().to_string(), "127.0.0.1", "one server: loopback");
    let two = r#"{"version":"1.2","status":"completed","server_count":"2","server_list":[
        {"server_id":"10.9.9.8","device":[{"device_id":"0","device_ip":"x","super_device_id":"1","rank_id":"1"}]},
        {"server_id":"10.9.9.9","device":[{"device_id":"0","device_ip":"x","super_device_id":"2","rank_id":"0"}]}],
        "super_pod_list":[{"super_pod_id":"0","server_list":[{"server_id":"10.9.9.8"},{"server_id":"10.9.9.9"}]}]}"#;
    let path2 = table_file("two.json", two);
    let e = ok(&[("MINDSPORE_HCCL_CONFIG_PATH", &path2), ("RANK_ID", "1")]);
    assert_eq!((e.rank, e.world_size, e.node), (1, 2, Some(0)));
    let Meet::Rank0 { dial, .. } = e.meet else { panic!("{:?}", e.meet) };
    assert_eq!(dial.ip().to_string(), "10.9.9.9", "rank 0's server");
    refused(&[("RANK_TABLE_FILE", &path)], &["RANK_ID is not", "0..2"]);
    refused(&[("RANK_TABLE_FILE", &path), ("RANK_ID", "2")], &["RANK_ID=2 is not in"]);
    refused(&[("RANK_TABLE_FILE", "/nonexistent/hccl.json"), ("RANK_ID", "0")], &["cannot read"]);
    let bad = table_file("bad.json", r#"{"version":"9"}"#);
    refused(&[("RANK_TABLE_FILE", &bad), ("RANK_ID", "0")], &["version \"9\""]);
    // With another launcher, a table without RANK_ID is left alone.
    assert_eq!(ok(&with(MPIRUN, &[("RANK_TABLE_FILE", "/nonexistent")])).launcher, Launcher::OpenMpi);
}

#[test]
fn every_variable_read_is_in_the_table() {
    let seen = RefCell::default();
    let path = table_file("all.json", super::super::ranktable::tests::V10);
    let mut envs: Vec<Vec<(&str, &str)>> = [SRUN_ONE_NODE, SRUN_TWO_NODES, BATCH, ORTED_STEP, MPIRUN, TORCHRUN, MSRUN]
        .iter()
        .map(|e| e.to_vec())
        .collect();
    envs.push(vec![("PMI_RANK", "0"), ("PMI_SIZE", "1")]);
    envs.push(vec![("RANK_TABLE_FILE", &path), ("RANK_ID", "0")]);
    envs.push(vec![("HCCN_RANK", "0"), ("HCCN_WORLD_SIZE", "1"), ("HCCN_STORE", "etcd://h:1")]);
    envs.push(vec![]);
    for env in &envs {
        let _ = detect_with(env, &seen);
    }
    let known: BTreeSet<&str> = VARIABLES.iter().map(|v| v.name).collect();
    let missing: Vec<String> = seen.borrow().iter().filter(|n| !known.contains(n.as_str())).cloned().collect();
    assert!(missing.is_empty(), "read but not in config::VARIABLES (and so not in the README): {missing:?}");
    assert!(seen.borrow().len() > 40, "the environments above reach every launcher: {:?}", seen.borrow());
}

#[test]
fn describe_says_launcher_numbers_and_store() {
    let lines = ok(&with(ORTED_STEP, MPIRUN)).describe();
    assert!(lines[0].contains("Open MPI"), "{lines:?}");
    assert!(lines[1].contains("rank 1 of 4, local rank 1 of 4"), "{lines:?}");
    assert!(lines[2].contains("PMIx"), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with("also: Slurm srun says rank 0 of 1")), "{lines:?}");
}
