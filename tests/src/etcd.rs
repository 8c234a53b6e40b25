//! A real etcd for tests: the launcher's private etcd (`hccnrun --etcd-local`), reused.

pub use hccn_tools::etcd_local::LocalEtcd as EtcdServer;
