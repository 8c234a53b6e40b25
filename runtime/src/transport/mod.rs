//! Moving frames between ranks. A [`Net`] joins the processes of one world: one [`Link`] per peer
//! and one [`Inbox`] where every arriving frame waits until the receive that matches it. Groups
//! and splits share their parent's `Net`; frames carry the communicator id that separates them.
//!
//! A peer's connection ending without a goodbye marks it failed, and every wait of a
//! communicator that contains it returns `RankFailed` at once.

pub(crate) mod channel;
pub(crate) mod shm_board;

/// How long a receiver whose sender withdrew its data (its operation failed) waits to learn
/// why before that is its error: whatever failed the sender's operation (a lost member, a
/// revoke, a mismatch) is told to every rank at once, on the control connections.
pub(crate) const WITHDRAW_GRACE: std::time::Duration = std::time::Duration::from_millis(100);

mod farewell;
pub(crate) mod heartbeat;
mod inbox;
mod kernel_liveness;
mod link;
mod net;
pub(crate) mod news;
pub(crate) mod ondemand;
mod placement;
pub(crate) mod pool;
pub(crate) mod pulse;
pub(crate) mod shm;
pub(crate) mod sink;
mod starved;
mod sweep;
pub(crate) mod tcp;
pub(crate) mod usage;
mod vouch;
pub(crate) mod wait;
pub(crate) mod waker;

pub(crate) use channel::Flow;
pub(crate) use inbox::{departure, Health, Inbox};
pub(crate) use link::{poll_yielding, DirectRead, Frame, Key, Link, POLL_ALONE_MAX, TCP_POLL};
pub(crate) use net::{incarnation, LinkTable, Net};
pub(crate) use news::Fault;
pub(crate) use ondemand::{Connector, Dialed, OnDemand};
pub(crate) use shm::fell_back;
pub use shm::{read_cost, ReadCost};
pub(crate) use sink::{Out, Sink};
pub(crate) use sweep::once as sweep_once;
pub use usage::Usage;
