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
    /// Ranks called a collective differently (kind, count, type, op or root).
    Mismatch,
    /// A second thread entered a blocking call on a communicator already in one.
    Busy,
}

/// The one table of result codes: the C enum (`hccn_result`), the error strings and the Python
/// enum are made from it or checked against it. Numbers are HcclResult's where the meaning is
/// the same and hccn's own from 100; a number is never reused or renumbered.
pub const RESULT_CODES: &[(Option<ErrorKind>, &str, u32, &str)] = &[
    (None, "HCCN_SUCCESS", 0, "success"),
    (Some(ErrorKind::InvalidArgument), "HCCN_ERROR_INVALID_ARGUMENT", 1, "invalid argument"),
    (Some(ErrorKind::NullPointer), "HCCN_ERROR_NULL_POINTER", 2, "null pointer"),
    (Some(ErrorKind::OutOfMemory), "HCCN_ERROR_OUT_OF_MEMORY", 3, "out of memory"),
    (Some(ErrorKind::Internal), "HCCN_ERROR_INTERNAL", 4, "internal error"),
    (Some(ErrorKind::NotSupported), "HCCN_ERROR_NOT_SUPPORTED", 5, "not supported"),
    (Some(ErrorKind::NotFound), "HCCN_ERROR_NOT_FOUND", 6, "not found"),
    (Some(ErrorKind::Unavailable), "HCCN_ERROR_UNAVAILABLE", 7, "unavailable"),
    (Some(ErrorKind::System), "HCCN_ERROR_SYSTEM", 8, "system call failed"),
    (Some(ErrorKind::Timeout), "HCCN_ERROR_TIMEOUT", 9, "timed out"),
    (Some(ErrorKind::Connect), "HCCN_ERROR_CONNECT", 11, "connection failed"),
    (Some(ErrorKind::Transfer), "HCCN_ERROR_TRANSFER", 13, "transfer failed"),
    (Some(ErrorKind::Backend), "HCCN_ERROR_BACKEND", 15, "backend library failed"),
    (Some(ErrorKind::Remote), "HCCN_ERROR_REMOTE", 21, "remote peer error"),
    (Some(ErrorKind::RankFailed), "HCCN_ERROR_RANK_FAILED", 100, "a member rank failed or is unreachable"),
    (Some(ErrorKind::Revoked), "HCCN_ERROR_REVOKED", 101, "communicator revoked"),
    (Some(ErrorKind::Aborted), "HCCN_ERROR_ABORTED", 102, "communicator aborted"),
    (None, "HCCN_IN_PROGRESS", 103, "in progress"),
    (Some(ErrorKind::Auth), "HCCN_ERROR_AUTH", 104, "job-token authentication failed"),
    (Some(ErrorKind::Store), "HCCN_ERROR_STORE", 105, "rendezvous store unreachable or refused"),
    (Some(ErrorKind::StaleEpoch), "HCCN_ERROR_STALE_EPOCH", 106, "stale epoch"),
    (Some(ErrorKind::Mismatch), "HCCN_ERROR_MISMATCH", 107, "ranks called a collective with different arguments"),
    (Some(ErrorKind::Busy), "HCCN_ERROR_BUSY", 108, "communicator in use by another thread"),
];

impl ErrorKind {
    /// Its `hccn_result` number (see [`RESULT_CODES`]).
    pub fn code(self) -> u32 {
        RESULT_CODES.iter().find(|r| r.0 == Some(self)).map_or(4, |r| r.2)
    }

    /// The kind whose `hccn_result` number is `code`.
    pub fn from_code(code: u32) -> Option<ErrorKind> {
        RESULT_CODES.iter().find(|r| r.2 == code).and_then(|r| r.0)
    }
}

/// An error with a human-readable message and, for failures of members, the failed ranks
/// (numbered in the communicator that observed them).
///
/// Boxed: a `Result<(), Error>` is then one pointer, returned in a register, where the error's
/// three fields made every result on the hot path a 48-byte copy through memory.
#[derive(Clone, PartialEq, Eq)]
pub struct Error(Box<Inner>);

#[derive(Clone, PartialEq, Eq)]
struct Inner {
    kind: ErrorKind,
    message: String,
    failed_ranks: Vec<u32>,
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.0.kind)
            .field("message", &self.0.message)
            .field("failed_ranks", &self.0.failed_ranks)
            .finish()
    }
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error(Box::new(Inner { kind, message: message.into(), failed_ranks: Vec::new() }))
    }

    pub fn rank_failed(failed_ranks: Vec<u32>, message: impl Into<String>) -> Self {
        Error(Box::new(Inner { kind: ErrorKind::RankFailed, message: message.into(), failed_ranks }))
    }

    /// The same error naming `ranks` as the members it is about.
    pub fn with_failed(mut self, ranks: Vec<u32>) -> Self {
        self.0.failed_ranks = ranks;
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    pub fn message(&self) -> &str {
        &self.0.message
    }

    pub fn failed_ranks(&self) -> &[u32] {
        &self.0.failed_ranks
    }

    /// Prefixes the message with where it happened, keeping kind and ranks.
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.0.message = format!("{what}: {}", self.0.message);
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

    /// An I/O error that says this process ran short (of descriptors, memory, socket buffers or
    /// local ports), not that the peer it was reaching failed: `None` for any other error.
    pub fn local_shortage(what: impl fmt::Display, e: &std::io::Error) -> Option<Self> {
        let short = match e.raw_os_error()? {
            libc::EMFILE => "this process is out of file descriptors (raise `ulimit -n`)",
            libc::ENFILE => "the host is out of file descriptors",
            libc::ENOMEM | libc::ENOBUFS => "this host is out of memory for sockets",
            libc::EADDRNOTAVAIL => "this host is out of local ports",
            _ => return None,
        };
        let kind = if e.raw_os_error() == Some(libc::ENOMEM) { ErrorKind::OutOfMemory } else { ErrorKind::System };
        Some(Error::new(kind, format!("{what}: {e}: {short}; a shortage on this rank, not its peer's failure")))
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
        write!(f, "{}", self.0.message)
    }
}

impl std::error::Error for Error {}
