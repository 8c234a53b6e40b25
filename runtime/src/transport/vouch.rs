//! Host-mates vouch for a remote host. A deep queue on a congested path may hold back, for a
//! second or more, every segment one remote host sends to one rank of this host, while another
//! rank here still receives that host's data: the remote host is not silent, only this rank's
//! share of its path is late. So each rank publishes, in the shared-memory links to its
//! host-mates, the moment it last heard each remote host; a rank about to fail a remote peer
//! for silence reads them, and a host that anyone here still hears is congested, not cut off.
//! Only a whole host's silence (nobody on this host hears it) is judged by time.
//!
//! A rank publishes what it heard itself, on its own links, never what its host-mates told it:
//! no vouching on hearsay, so a host that nobody hears ages out of every table.
//!
//! Each entry is one 64-bit word, which a reader never sees half written: a 24-bit tag of the
//! host (from its [`HostId`]) and the moment, in milliseconds of CLOCK_MONOTONIC (one clock for
//! every process of a host). Two hosts whose tags collide only lend each other patience, a
//! backstop that still ends.

use std::time::Duration;

use super::shm::HostId;

/// Remote hosts a rank publishes: those it heard last, when it hears more.
pub(crate) const SLOTS: usize = 32;

/// Bits of an entry that hold the moment (ms): 34 years of uptime.
const MS_BITS: u32 = 40;
const MS_MASK: u64 = (1 << MS_BITS) - 1;

/// How a silent remote peer's host is heard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostHeard {
    /// Nobody on this host heard it within `dead_after`: time decides.
    Silent,
    /// This rank hears another of its ranks.
    ByMe,
    /// A host-mate hears it (this rank hears nothing from it).
    ByMate,
}

impl HostHeard {
    pub fn heard(self) -> bool {
        self != HostHeard::Silent
    }
}

/// The evidence on a silent peer's host: how long ago this rank heard it (`own`, on any link)
/// and its host-mates did (`mates`), against HCCN_DEAD_AFTER_MS.
pub(crate) fn host_heard(own: Option<Duration>, mates: Option<Duration>, dead_after: Duration) -> HostHeard {
    match (own, mates) {
        (Some(d), _) if d < dead_after => HostHeard::ByMe,
        (_, Some(d)) if d < dead_after => HostHeard::ByMate,
        _ => HostHeard::Silent,
    }
}

/// A host's tag in the entries: never zero (an empty slot).
pub(crate) fn tag(host: &HostId) -> u32 {
    u32::from_le_bytes([host[0], host[1], host[2], 0]).max(1)
}

/// The entries a rank publishes at `now_ms`, from how long ago it heard each host (by tag):
/// the hosts heard last first, up to [`SLOTS`]; the slots left are empty (zero).
pub(crate) fn entries(now_ms: u64, heard: impl IntoIterator<Item = (u32, Duration)>) -> [u64; SLOTS] {
    let mut heard: Vec<(u32, Duration)> = heard.into_iter().collect();
    heard.sort_unstable_by_key(|&(_, d)| d);
    let mut out = [0u64; SLOTS];
    for (slot, (tag, ago)) in out.iter_mut().zip(heard) {
        let at = now_ms.saturating_sub(u64::try_from(ago.as_millis()).unwrap_or(u64::MAX));
        *slot = u64::from(tag) << MS_BITS | (at & MS_MASK);
    }
    out
}

/// How long before `now_ms` host `tag` was last heard, by the entries of every host-mate
/// (`words`); `None` when none of them names it.
pub(crate) fn mates_heard(now_ms: u64, tag: u32, words: impl IntoIterator<Item = u64>) -> Option<Duration> {
    words
        .into_iter()
        .filter(|&w| w != 0 && (w >> MS_BITS) as u32 == tag)
        .map(|w| Duration::from_millis((now_ms & MS_MASK).saturating_sub(w & MS_MASK)))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn a_host_heard_by_anyone_here_is_heard_and_only_a_whole_hosts_silence_is_not() {
        let dead = ms(800);
        let cases = [
            // (this rank heard it, a host-mate heard it, verdict)
            (Some(100), None, HostHeard::ByMe),
            (Some(100), Some(5), HostHeard::ByMe),
            (Some(1200), Some(50), HostHeard::ByMate),
            (None, Some(799), HostHeard::ByMate),
            (Some(1200), Some(800), HostHeard::Silent),
            (Some(900), None, HostHeard::Silent),
            (None, None, HostHeard::Silent),
        ];
        for (own, mates, want) in cases {
            assert_eq!(host_heard(own.map(ms), mates.map(ms), dead), want, "own {own:?} mates {mates:?}");
        }
    }

    #[test]
    fn entries_say_when_each_host_was_heard_and_are_read_back() {
        let (a, b) = (tag(&[7; 32]), tag(&[9; 32]));
        let words = entries(10_000, [(a, ms(300)), (b, ms(40))]);
        assert_eq!(words.iter().filter(|&&w| w != 0).count(), 2);
        // Read later by a host-mate: the moment, not the age, was published.
        assert_eq!(mates_heard(10_100, a, words), Some(ms(400)));
        assert_eq!(mates_heard(10_100, b, words), Some(ms(140)));
        assert_eq!(mates_heard(10_100, tag(&[1; 32]), words), None);
        // Several host-mates: the freshest word counts.
        let other = entries(10_050, [(a, ms(0))]);
        assert_eq!(mates_heard(10_100, a, words.into_iter().chain(other)), Some(ms(50)));
        // Nothing published: no evidence, and no tag is zero.
        assert_eq!(mates_heard(10_100, tag(&[0; 32]), [0u64; SLOTS]), None);
    }

    #[test]
    fn the_hosts_heard_last_are_published_when_there_are_more_than_slots() {
        let heard = (0..SLOTS as u32 + 8).map(|t| (t + 1, ms(u64::from(t) * 10)));
        let words = entries(100_000, heard);
        assert!(mates_heard(100_000, 1, words).is_some(), "the host heard last is published");
        assert!(mates_heard(100_000, SLOTS as u32 + 8, words).is_none(), "the host heard first is not");
    }
}
