//! Worlds whose ranks are threads of the test process (real sockets, real store): fast to run
//! and to debug.

use hccn_runtime::{new_unique_id, Communicator, Config};

/// A world of `n` ranks under `cfg`, each communicator made on its own thread.
pub fn world(n: u32, cfg: &Config) -> Vec<Communicator> {
    let id = new_unique_id(cfg).expect("unique id");
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let (id, cfg) = (id.clone(), cfg.clone());
            std::thread::spawn(move || Communicator::init_rank(&id, n, r, &cfg).expect("init_rank"))
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("join")).collect()
}
