//! The roster: how the ranks of a world learn each other's records. Each rank publishes its
//! own; world rank 0 gathers them and publishes the roster, which every other rank reads in one
//! round trip, once rank 0's own record shows it runs this protocol. A rank started with another
//! world size or protocol fails the meeting at once, on every rank, naming both values; a rank
//! that waits in vain names the ranks that never came and the job id it waited under.

//!
//! Every wait here lasts while ranks keep arriving: a rank gives up once nobody new arrived for
//! the timeout (patience.rs), not one timeout after its own start.

use std::time::Duration;

use super::ondemand::{Protocol, Published, Record};
use super::patience::{Arrivals, Next};
use super::Store;
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};

/// Where in the store a world meets: its key prefix, and the job it belongs to, if any (ranks
/// started with another job id meet under another prefix, never seen from this one).
#[derive(Clone, Copy)]
pub(crate) struct Place<'a> {
    pub prefix: &'a str,
    pub job: Option<&'a str>,
}

impl Place<'_> {
    pub(super) fn addr_key(&self, rank: u32) -> String {
        format!("{}/addr/{rank}", self.prefix)
    }

    pub(super) fn roster_key(&self) -> String {
        format!("{}/roster", self.prefix)
    }
}

/// World rank `peer`'s record as `rank` (this one) reads it: a rank running another protocol is
/// named as such.
pub(super) fn parse_record(raw: &[u8], (peer, rank): (u32, u32)) -> Result<Record> {
    let text = String::from_utf8_lossy(raw);
    match Record::read(&text) {
        Published::Ours(record) => Ok(record),
        Published::Other(theirs) => Err(protocols_differ(rank, peer, &theirs)),
        Published::Unreadable => {
            Err(Error::new(ErrorKind::Store, format!("the address rank {peer} published cannot be read: {text:?}")))
        }
    }
}

/// World rank 0: every rank's record (its own is `mine`), gathered from the store and
/// published as the roster, one record per line in rank order. A rank started with another
/// world size or protocol fails the meeting: the reason goes in the roster's place, so that
/// the others read it at once instead of waiting for a roster.
pub(super) fn gather_roster(
    store: &dyn Store,
    at: Place<'_>,
    size: u32,
    mine: &Record,
    cfg: &Config,
) -> Result<Vec<Record>> {
    let mut roster = vec![mine.clone()];
    let mut arrivals = Arrivals::watch(store, at.prefix, cfg.timeout)?;
    for peer in 1..size {
        let refused = match own_record(&mut arrivals, at, (peer, size), cfg)? {
            Ok(record) if record.size == size => {
                roster.push(record);
                continue;
            }
            Ok(record) => sizes_differ(0, size, peer, record.size),
            Err(theirs) => protocols_differ(0, peer, &theirs),
        };
        let _ = store.set(&at.roster_key(), format!("{REFUSED}{}", refused.message()).as_bytes());
        return Err(refused);
    }
    let text: Vec<String> = roster.iter().map(Record::encode).collect();
    store.set(&at.roster_key(), text.join("\n").as_bytes())?;
    Ok(roster)
}

/// Any other rank: the roster world rank 0 published (see [`gather_roster`]), once rank 0's
/// own record shows it runs this protocol (one of another publishes no roster this rank can
/// read). A roster that does not hold this rank's own record (`mine`) is a previous run's, left
/// under the same prefix, or one rank 0 gathered before this rank published: then each rank's
/// own record is read instead. A record rank 0 read before its rank replaced it is a previous
/// run's too: a connection that fails asks for the peer's own record, as it always did.
pub(super) fn read_roster(
    store: &dyn Store,
    at: Place<'_>,
    (rank, size): (u32, u32),
    mine: &Record,
    cfg: &Config,
) -> Result<Vec<Record>> {
    let mut arrivals = Arrivals::watch(store, at.prefix, cfg.timeout)?;
    let Some(first) = arrivals.get(&at.addr_key(0))? else {
        return Err(missing_ranks(store, at, size, cfg));
    };
    if let Published::Other(theirs) = Record::read(&String::from_utf8_lossy(&first)) {
        return Err(protocols_differ(rank, 0, &theirs));
    }
    let Some(raw) = arrivals.get(&at.roster_key())? else {
        return Err(missing_ranks(store, at, size, cfg));
    };
    let text = String::from_utf8_lossy(&raw);
    if let Some(why) = text.strip_prefix(REFUSED) {
        return Err(Error::invalid(why.to_owned()));
    }
    let roster: Vec<Option<Record>> = text.split('\n').map(Record::parse).collect();
    // Rank 0's own record comes first: a world of another size is not this rank's to wait for.
    if let Some(Some(first)) = roster.first().filter(|_| roster.len() != size as usize) {
        if first.size != size && first.size as usize == roster.len() {
            return Err(sizes_differ(rank, size, 0, first.size));
        }
    }
    let roster = match roster.len() == size as usize && roster[rank as usize].as_ref() == Some(mine) {
        true => roster,
        false => vec![None; size as usize],
    };
    let own = |(peer, r): (usize, Option<Record>)| match r {
        Some(r) => Ok(r),
        None if peer as u32 == rank => Ok(mine.clone()),
        None => own_record(&mut arrivals, at, (peer as u32, size), cfg)?
            .map_err(|theirs| protocols_differ(rank, peer as u32, &theirs)),
    };
    roster.into_iter().enumerate().map(own).collect()
}

/// World rank `peer`'s own record, waited for while the store holds none or one that cannot be
/// read (a previous run's, until the peer publishes its own); the protocol of a record of
/// another one.
fn own_record(
    arrivals: &mut Arrivals<'_>,
    at: Place<'_>,
    (peer, size): (u32, u32),
    cfg: &Config,
) -> Result<std::result::Result<Record, Protocol>> {
    loop {
        let Some(raw) = arrivals.get(&at.addr_key(peer))? else {
            return Err(missing_ranks(arrivals.store(), at, size, cfg));
        };
        match Record::read(&String::from_utf8_lossy(&raw)) {
            Published::Ours(record) => return Ok(Ok(record)),
            Published::Other(theirs) => return Ok(Err(theirs)),
            Published::Unreadable if arrivals.next() == Next::GiveUp => {
                return Err(Error::timeout(format!(
                    "rank {peer} did not publish its address: no rank arrived for {} ms (the store holds one this \
                     rank cannot read, left by an earlier run?)",
                    cfg.timeout.as_millis()
                )))
            }
            Published::Unreadable => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// What rank 0 publishes instead of the roster when the world cannot meet (then the reason).
const REFUSED: &str = "refused: ";

/// The error of ranks started with different world sizes: `rank` (this one) with `size`,
/// `other` with `other_size`.
fn sizes_differ(rank: u32, size: u32, other: u32, other_size: u32) -> Error {
    Error::invalid(format!(
        "world sizes differ: rank {rank} was started with a world of {size} ranks, rank {other} with \
         {other_size}; start every rank with the same world size (hccnrun -n, WORLD_SIZE, HCCN_WORLD_SIZE, \
         the launcher's task count)"
    ))
}

/// The error of a rank (this one) that meets rank `other` running another protocol.
fn protocols_differ(rank: u32, other: u32, theirs: &Protocol) -> Error {
    Error::invalid(format!(
        "hccn versions differ: rank {other} runs {theirs}, rank {rank} runs {}; ranks of different protocols \
         cannot work together: install the same hccn on every rank (the same wheel, or the same libhccn.so on \
         every host)",
        Protocol::ours()
    ))
}

/// The error of a world that did not meet in time: which ranks never published their address
/// (one look each, on this path only), and under which job id this rank waited.
fn missing_ranks(store: &dyn Store, at: Place<'_>, size: u32, cfg: &Config) -> Error {
    let missing: Vec<u32> = (0..size).filter(|&r| store.get(&at.addr_key(r), Duration::ZERO).is_err()).collect();
    if missing.is_empty() {
        return Error::timeout(format!(
            "world rank 0 did not publish the roster of addresses {} ms after the last rank arrived, though every \
             rank published its own",
            cfg.timeout.as_millis()
        ));
    }
    let job = match at.job {
        Some(job) => format!(
            "; this rank waited under job id {job:?} (HCCN_JOB_ID): ranks started with another job id meet under \
             theirs and are never seen here, so give every rank the same one"
        ),
        None => String::new(),
    };
    Error::timeout(format!(
        "the world of {size} ranks did not meet: no rank arrived for {} ms, and ranks {missing:?} never published \
         their address (did they start, with the same store and world size?){job}",
        cfg.timeout.as_millis()
    ))
}
