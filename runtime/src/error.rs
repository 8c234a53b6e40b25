//! The runtime's error type. The C ABI maps [`ErrorKind`] to its numbered `hccn_result`.

use std::fmt;

/// What went wrong, in the categories a caller can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    InvalidArgument,
    NullPointer,
    OutOfMemory,
    Internal,
    NotSupported,
    NotFound,
    Unavailable,
    System,
    Timeout,
    Connect,
    Transfer,
    Backend,
    Remote,
    /// A member died or is unreachable; [`Error::failed_ranks`] names it.
    RankFailed,
    Revoked,
    Aborted,
    Auth,
    Store,
    StaleEpoch,
}

/// An error with a human-readable message and, for failures of members, the failed ranks
/// (numbered in the communicator that observed them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    failed_ranks: Vec<u32>,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into(), failed_ranks: Vec::new() }
    }

    pub fn rank_failed(failed_ranks: Vec<u32>, message: impl Into<String>) -> Self {
        Error { kind: ErrorKind::RankFailed, message: message.into(), failed_ranks }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn failed_ranks(&self) -> &[u32] {
        &self.failed_ranks
    }

    /// Prefixes the message with where it happened, keeping kind and ranks.
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    pub fn null(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::NullPointer, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Internal, message)
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Timeout, message)
    }

    /// Maps an I/O error on a peer or store connection to the closest kind.
    pub fn io(kind_if_other: ErrorKind, what: impl fmt::Display, e: &std::io::Error) -> Self {
        use std::io::ErrorKind as Io;
        let kind = match e.kind() {
            Io::WouldBlock | Io::TimedOut => ErrorKind::Timeout,
            _ => kind_if_other,
        };
        Error::new(kind, format!("{what}: {e}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for Error {}
