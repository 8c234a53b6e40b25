//! hccn's control plane. Today: the etcd v3 rendezvous store (`HCCN_STORE=etcd://...`) for
//! multi-host and elastic jobs. tokio lives here only; the data path never touches etcd.

mod access;
mod background;
mod etcd;
mod lease;
mod runs;

pub use etcd::EtcdStore;

/// Makes `etcd://` store addresses usable by the runtime in this process.
pub fn install() {
    hccn_runtime::rendezvous::register_etcd(etcd::connect);
}
