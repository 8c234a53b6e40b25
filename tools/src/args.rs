//! Hand-rolled command-line parsing shared by the tools: `-x VALUE`, `--long VALUE` and
//! `--long=VALUE`, with `--` ending the options.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fmt;
use std::time::Duration;

/// A command-line mistake; the tools print it with their usage and exit 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage(msg: impl Into<String>) -> UsageError {
    UsageError(msg.into())
}

/// The arguments still to be read.
#[derive(Debug)]
pub struct Args {
    items: VecDeque<OsString>,
}

impl Args {
    /// The process's arguments without the program name.
    pub fn from_env() -> Args {
        Args::new(std::env::args_os().skip(1))
    }

    pub fn new<I: IntoIterator<Item = S>, S: Into<OsString>>(items: I) -> Args {
        Args { items: items.into_iter().map(Into::into).collect() }
    }

    /// The next option as `(name, inline value)`, or `None` at the first positional argument
    /// (left in place) or after `--` (consumed).
    pub fn next_option(&mut self) -> Result<Option<(String, Option<String>)>, UsageError> {
        let Some(front) = self.items.front() else { return Ok(None) };
        if front == "--" {
            self.items.pop_front();
            return Ok(None);
        }
        let is_option = front.as_encoded_bytes().starts_with(b"-") && front.len() > 1;
        if !is_option {
            return Ok(None);
        }
        let raw = self.items.pop_front().unwrap_or_default();
        let text = raw.into_string().map_err(|o| usage(format!("option {o:?} is not valid UTF-8")))?;
        if text.starts_with("--") {
            if let Some((name, value)) = text.split_once('=') {
                return Ok(Some((name.to_owned(), Some(value.to_owned()))));
            }
        }
        Ok(Some((text, None)))
    }

    /// The value of option `name`: the inline `=value` if given, else the next argument.
    pub fn value(&mut self, name: &str, inline: Option<String>) -> Result<String, UsageError> {
        if let Some(v) = inline {
            return Ok(v);
        }
        let v = self.items.pop_front().ok_or_else(|| usage(format!("{name} needs a value")))?;
        v.into_string().map_err(|v| usage(format!("value {v:?} of {name} is not valid UTF-8")))
    }

    /// The next argument, taken as a positional one (call it when `next_option` gave `None`).
    pub fn positional(&mut self) -> Option<OsString> {
        self.items.pop_front()
    }

    /// Whatever has not been read.
    pub fn rest(self) -> Vec<OsString> {
        self.items.into()
    }
}

pub fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, UsageError> {
    value.trim().parse().map_err(|_| usage(format!("{name}: {value:?} is not a valid number")))
}

/// A non-negative number of seconds, fractions allowed.
pub fn seconds(name: &str, value: &str) -> Result<Duration, UsageError> {
    let s: f64 = number(name, value)?;
    Duration::try_from_secs_f64(s)
        .map_err(|_| usage(format!("{name}: {value:?} is not a non-negative number of seconds")))
}

/// A byte count with an optional K, M or G suffix (powers of 1024), as nccl-tests takes.
pub fn bytes(name: &str, value: &str) -> Result<u64, UsageError> {
    let v = value.trim();
    let (digits, shift) = match v.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&v[..v.len() - 1], 10),
        Some('M') => (&v[..v.len() - 1], 20),
        Some('G') => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    let n: u64 =
        digits.parse().map_err(|_| usage(format!("{name}: {value:?} is not a byte count like 8, 64K, 32M or 1G")))?;
    n.checked_mul(1 << shift).ok_or_else(|| usage(format!("{name}: {value:?} is too large")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_values_and_positionals() {
        let mut a = Args::new(["-n", "4", "--timeout=2.5", "--grace", "1", "--", "-prog", "x"]);
        assert_eq!(a.next_option(), Ok(Some(("-n".into(), None))));
        assert_eq!(a.value("-n", None).as_deref(), Ok("4"));
        assert_eq!(a.next_option(), Ok(Some(("--timeout".into(), Some("2.5".into())))));
        assert_eq!(a.next_option(), Ok(Some(("--grace".into(), None))));
        assert_eq!(a.value("--grace", None).as_deref(), Ok("1"));
        assert_eq!(a.next_option(), Ok(None));
        assert_eq!(a.rest(), vec![OsString::from("-prog"), OsString::from("x")]);

        let mut a = Args::new(["prog", "-n"]);
        assert_eq!(a.next_option(), Ok(None));
        assert_eq!(a.rest().len(), 2);
        assert!(Args::new(Vec::<String>::new()).value("-b", None).is_err());
    }

    #[test]
    fn byte_counts_and_seconds() {
        assert_eq!(bytes("-b", "8"), Ok(8));
        assert_eq!(bytes("-b", "64K"), Ok(64 << 10));
        assert_eq!(bytes("-b", "32m"), Ok(32 << 20));
        assert_eq!(bytes("-b", "1G"), Ok(1 << 30));
        assert!(bytes("-b", "1T").is_err());
        assert!(bytes("-b", "M").is_err());
        assert!(bytes("-b", "99999999999999999G").is_err());
        assert_eq!(seconds("--grace", "0.5"), Ok(Duration::from_millis(500)));
        assert!(seconds("--grace", "-1").is_err());
        assert!(seconds("--grace", "soon").is_err());
    }
}
