//! The environment each rank starts with: hccn's variables, torchrun's (RANK, WORLD_SIZE,
//! LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), what `-x` exports, and
//! OMP_NUM_THREADS=1 unless it is set (torchrun's default: N ranks each running as many OpenMP
//! threads as there are cores overload the host many times over).

use std::net::{IpAddr, SocketAddr, TcpListener};

use super::options::Options;
use crate::hostfile::{self, Place};

/// torchrun's MASTER_PORT when the user names only the address.
const TORCHRUN_PORT: u16 = 29500;

/// What every rank of the job gets, and what varies by rank.
#[derive(Debug, Clone)]
pub(super) struct JobEnv {
    common: Vec<(String, String)>,
}

/// Where torch's own store will be: rank 0's host, and a port free there for it to bind (never
/// hccn's store port). `None` when the hosts of a multi-host job cannot agree on one by
/// themselves (no --master-addr).
fn master(o: &Options, bind_addr: IpAddr) -> Result<Option<(String, u16)>, String> {
    if o.nnodes > 1 {
        return Ok(o.master_addr.clone().map(|a| (a, o.master_port.unwrap_or(TORCHRUN_PORT))));
    }
    let addr = match (&o.master_addr, o.place(0)?.host) {
        (Some(a), _) => a.clone(),
        (None, Some(host)) => hostfile::listen_addr(host)?.to_string(),
        (None, None) => bind_addr.to_string(),
    };
    let port = match o.master_port {
        Some(p) => p,
        // Free here when hccnrun starts (for a remote rank 0: free on this host, the best guess
        // there is); the listener closes at once, so torch can bind it.
        None => TcpListener::bind(SocketAddr::new(bind_addr, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| format!("no free port on {bind_addr} for MASTER_PORT: {e}"))?,
    };
    Ok(Some((addr, port)))
}

impl JobEnv {
    /// `hccn`: HCCN_STORE, HCCN_JOB_ID, HCCN_JOB_TOKEN as the job has them.
    pub(super) fn new(o: &Options, hccn: Vec<(&str, String)>, bind_addr: IpAddr) -> Result<JobEnv, String> {
        let mut common: Vec<(String, String)> = hccn.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        let world = o.world_size().to_string();
        common.push(("HCCN_WORLD_SIZE".into(), world.clone()));
        common.push(("WORLD_SIZE".into(), world));
        if let Some((addr, port)) = master(o, bind_addr)? {
            common.push(("MASTER_ADDR".into(), addr));
            common.push(("MASTER_PORT".into(), port.to_string()));
        }
        if std::env::var_os("OMP_NUM_THREADS").is_none() {
            super::say(format_args!(
                "setting OMP_NUM_THREADS=1 for every rank (it is not set), so that the ranks do not \
                 overload the host; set it to tune"
            ));
            common.push(("OMP_NUM_THREADS".into(), "1".into()));
        }
        // -x comes last: what the user names wins.
        common.extend(o.exports.iter().cloned());
        Ok(JobEnv { common })
    }

    /// Everything rank `rank`, placed at `place`, starts with (a replacement gets the rank it
    /// replaces; hccn gives it its rank in the world when it joins).
    pub(super) fn for_rank(&self, rank: u32, place: &Place<'_>) -> Vec<(String, String)> {
        let mine = [
            ("HCCN_RANK", rank),
            ("HCCN_LOCAL_RANK", place.local),
            ("HCCN_LOCAL_WORLD_SIZE", place.local_size),
            ("RANK", rank),
            ("LOCAL_RANK", place.local),
            ("LOCAL_WORLD_SIZE", place.local_size),
            ("GROUP_RANK", place.node),
        ];
        let mut vars: Vec<(String, String)> = mine.iter().map(|(k, v)| ((*k).to_owned(), v.to_string())).collect();
        // -x may override any of them, so the common part (which ends with -x) comes after.
        vars.retain(|(k, _)| !self.common.iter().any(|(c, _)| c == k));
        let mut all = self.common.clone();
        all.extend(vars);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::Args;
    use crate::launch::options::{parse, Invocation};

    fn options(a: &[&str]) -> Options {
        match parse(Args::new(a.iter().copied())) {
            Ok(Invocation::Run(o)) => *o,
            other => panic!("{other:?}"),
        }
    }

    fn get<'a>(vars: &'a [(String, String)], k: &str) -> Option<&'a str> {
        vars.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn torchrun_variables_beside_hccn_ones() {
        let o = options(&["-n", "2", "-x", "LOCAL_RANK=9", "p"]);
        let env =
            JobEnv::new(&o, vec![("HCCN_STORE", "tcp://127.0.0.1:5".into())], [127, 0, 0, 1].into()).expect("env");
        let v = env.for_rank(1, &o.place(1).expect("place"));
        for (k, want) in [("RANK", "1"), ("HCCN_RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2")] {
            assert_eq!(get(&v, k), Some(want), "{k} in {v:?}");
        }
        assert_eq!((get(&v, "GROUP_RANK"), get(&v, "LOCAL_RANK")), (Some("0"), Some("9")), "-x wins: {v:?}");
        assert_eq!(get(&v, "MASTER_ADDR"), Some("127.0.0.1"));
        let port: u16 = get(&v, "MASTER_PORT").and_then(|p| p.parse().ok()).expect("a port");
        assert!(port != 5 && port != 0, "a free port, not the store's: {port}");
        let o = options(&["-n", "2", "--nnodes", "2", "--store", "tcp://127.0.0.1:5", "p"]);
        let env = JobEnv::new(&o, Vec::new(), [127, 0, 0, 1].into()).expect("env");
        assert_eq!(get(&env.for_rank(0, &o.place(0).expect("place")), "MASTER_PORT"), None, "no agreed port");
    }
}
