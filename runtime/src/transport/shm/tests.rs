use std::fs::OpenOptions;
use std::net::TcpStream;
use std::time::Duration;

use super::cma::*;
use super::handshake::*;
use super::segment::*;
use super::*;

#[test]
fn descriptors_round_trip_and_other_lengths_are_refused() {
    let region = RegionRef { id: 3, fd: 17, ino: 99, base: 0x7fff_1234_0000, len: 1 << 21, frees: 2 };
    for region in [None, Some(region)] {
        let d = Desc { addr: 0x7fff_1234_5670, len: (1 << 20) + 12, index: 41, region };
        let mut b = [0u8; Desc::IN_REGION];
        let n = d.encode(&mut b);
        assert_eq!(n, if region.is_some() { Desc::IN_REGION } else { Desc::PLAIN });
        assert_eq!(Desc::decode(&b[..n]), Some(d));
        assert_eq!(Desc::decode(&b[..n - 1]), None);
    }
    assert_eq!(Desc::decode(&[0u8; Desc::PLAIN + 1]), None);
}

#[test]
fn the_probe_reads_this_process_and_fails_cleanly_otherwise() {
    let m = cma_magic();
    let (me, addr, value) = (std::process::id() as i32, m.as_ptr() as u64, m.load(Ordering::Relaxed));
    assert!(cma_probe(me, addr, value), "reading this process's own magic");
    assert!(!cma_probe(me, addr, value ^ 1), "a wrong value");
    assert!(!cma_probe(me, 8, value), "an unmapped address");
    // Above the largest pid Linux hands out: no such process.
    let e = cma_read(i32::MAX, addr, &mut [0u8; 8]).err().and_then(|e| e.raw_os_error());
    assert_eq!(e, Some(libc::ESRCH));
    assert!(!cma_probe(i32::MAX, addr, value));
    let bogus = [1u8, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(cma_offer(&bogus).0, None, "a pid above i32::MAX");
}

/// `n` ranks in threads of this process, each connected to every other over loopback, run the
/// whole handshake; `allow(rank)` is each rank's (transport, single-copy) setting. Returns per
/// rank, per peer in ascending order: the peer, and its link's CMA pid if there is a link.
fn handshake_among(
    n: u32,
    mesh: u64,
    allow: impl Fn(u32) -> (Transport, bool),
) -> Vec<Vec<(u32, Option<Option<i32>>)>> {
    let listeners: Vec<_> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind")).collect();
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().expect("addr")).collect();
    let mut socks: Vec<Vec<(u32, TcpStream)>> = (0..n).map(|_| Vec::new()).collect();
    for a in 0..n {
        for b in a + 1..n {
            // Rank b connects to rank a, as the mesh does (higher ranks dial lower ones).
            let dialed = TcpStream::connect(addrs[a as usize]).expect("connect");
            let (accepted, _) = listeners[a as usize].accept().expect("accept");
            socks[a as usize].push((b, accepted));
            socks[b as usize].push((a, dialed));
        }
    }
    let host = host_id();
    std::thread::scope(|s| {
        let runs: Vec<_> = socks
            .into_iter()
            .enumerate()
            .map(|(me, mut mine)| {
                let (transport, cma) = allow(me as u32);
                let cma = if cma { Cma::Auto } else { Cma::Off };
                let cfg = Config { transport, cma, timeout: Duration::from_secs(10), ..Config::default() };
                s.spawn(move || {
                    mine.sort_by_key(|(p, _)| *p);
                    let learnt = handshake(&mut mine, me as u32, mesh, &host, &cfg).expect("handshake");
                    mine.iter().zip(learnt).map(|((p, _), l)| (*p, l.link.map(|l| l.cma_pid))).collect()
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().expect("join")).collect()
    })
}

#[test]
fn every_pair_gets_a_segment_at_once_and_no_name_stays_behind() {
    let mesh = 0x5eed_0000_0000_0000 | u64::from(std::process::id());
    let me = Some(std::process::id() as i32);
    let got = handshake_among(5, mesh, |_| (Transport::Auto, true));
    for (rank, peers) in got.iter().enumerate() {
        assert_eq!(peers.len(), 4);
        for (peer, link) in peers {
            assert_eq!(*link, Some(me), "rank {rank}, peer {peer}: a segment with single-copy reads");
        }
    }
    let prefix = format!("hccn-{mesh:016x}-");
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .expect("/dev/shm")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "segment names left in /dev/shm: {left:?}");
}

#[test]
fn both_sides_agree_on_single_copy_only_when_both_allow_and_tcp_only_ranks_get_no_segment() {
    let mesh = 0x5eed_1000_0000_0000 | u64::from(std::process::id());
    let me = Some(std::process::id() as i32);
    // Rank 1 forbids single-copy reads; rank 2 wants TCP only.
    let got = handshake_among(4, mesh, |r| match r {
        1 => (Transport::Auto, false),
        2 => (Transport::Tcp, true),
        _ => (Transport::Auto, true),
    });
    let link = |a: usize, b: u32| got[a].iter().find(|(p, _)| *p == b).map(|(_, l)| *l).expect("peer");
    assert_eq!((link(0, 3), link(3, 0)), (Some(me), Some(me)));
    assert_eq!((link(0, 1), link(1, 0)), (Some(None), Some(None)), "a segment without single-copy reads");
    for other in [0, 1, 3] {
        assert_eq!((link(2, other), link(other as usize, 2)), (None, None), "rank 2 wants TCP only");
    }
}

/// Two ends of one segment in this process (world ranks 0 and 1), with single-copy reads
/// agreed on the sending and the receiving side as given.
fn pair(send_cma: bool, recv_cma: bool) -> (Shm, Shm) {
    // A file of its own per pair: tests run at once, and two pairs on one file share a segment.
    static PAIRS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nth = PAIRS.fetch_add(1, Ordering::Relaxed);
    let path = format!("/dev/shm/hccn-unit-{}-{nth}-{send_cma}-{recv_cma}", std::process::id());
    let f = OpenOptions::new().read(true).write(true).create_new(true).open(&path).expect("open");
    f.set_len(SEG_BYTES as u64).expect("size");
    let (a, b) = (Segment::map(&f, SEG_BYTES).expect("map"), Segment::map(&f, SEG_BYTES).expect("map"));
    let _ = std::fs::remove_file(&path);
    mark_cpus_unknown(&a);
    let me = std::process::id() as i32;
    let mut a = ShmPeer::new(a, true);
    let mut b = ShmPeer::new(b, false);
    a.cma_pid = send_cma.then_some(me);
    b.cma_pid = recv_cma.then_some(me);
    (a.reads_pay, b.reads_pay) = (send_cma, recv_cma);
    (Shm::new(0, vec![None, Some(a)], 2), Shm::new(1, vec![Some(b), None], 2))
}

fn hdr(seq: u64, len: usize) -> FrameHeader {
    FrameHeader { tag: 3, ..FrameHeader::control(FrameKind::Collective, 7, 0, seq, len) }
}

fn key(seq: u64) -> Key {
    Key { src: 0, kind: FrameKind::Collective, comm_id: 7, seq }
}

/// Receives `key` on `shm` into a Vec.
fn recv(shm: &Shm, inbox: &Inbox, k: Key) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut check = |_: &FrameHeader| Ok(());
    let mut piece = |off: usize, p: &[u8]| {
        assert_eq!(off, out.len(), "pieces in order");
        out.extend_from_slice(p);
    };
    let mut sink = Sink { check: &mut check, out: Out::Pieces(&mut piece), expect: usize::MAX };
    shm.recv(k, inbox, Duration::from_secs(2), &|_| None, &mut sink)?;
    Ok(out)
}

#[test]
fn each_side_says_where_it_runs_in_the_ring_it_produces() {
    let (a, b) = pair(false, true);
    let seen_by = |s: &Shm, peer: u32| s.peer(peer).expect("peer").rx.cpu_word().load(Ordering::Relaxed);
    assert_eq!((seen_by(&a, 1), seen_by(&b, 0)), (u32::MAX, u32::MAX), "nothing said yet");
    a.publish_cpu(1);
    assert_eq!((seen_by(&a, 1), seen_by(&b, 0)), (u32::MAX, 1));
    b.publish_cpu(0);
    assert_eq!((seen_by(&a, 1), seen_by(&b, 0)), (0, 1));
}

#[test]
fn a_host_mate_reads_when_the_other_side_last_heard_each_remote_host() {
    let (a, b) = pair(false, false);
    assert_eq!(b.mates_heard(5), None, "nothing published yet");
    a.publish_heard([(5, Duration::from_millis(300)), (6, Duration::from_millis(20))]);
    let heard = |s: &Shm, tag| s.mates_heard(tag).map(|d| d.as_millis());
    assert!(heard(&b, 5).is_some_and(|ms| (300..400).contains(&ms)), "{:?}", heard(&b, 5));
    assert!(heard(&b, 6).is_some_and(|ms| ms < 100), "{:?}", heard(&b, 6));
    assert_eq!(heard(&b, 7), None, "a host nobody heard");
    assert_eq!(heard(&a, 5), None, "a rank reads its host-mates' tables, not its own");
}

#[test]
fn a_descriptor_is_read_in_place_drained_or_withdrawn() {
    let bytes: Vec<u8> = (0..(CMA_PIECE * 2 + 12)).map(|i| (i * 7 % 251) as u8).collect();
    descriptors_in_every_state(&bytes, false);
    // The same from shareable memory, which the receiver maps rather than reads.
    let mut shared = crate::mem::SharedBuf::new(bytes.len()).expect("alloc");
    shared.copy_from_slice(&bytes);
    descriptors_in_every_state(&shared, true);
}

fn descriptors_in_every_state(payload: &[u8], mapped: bool) {
    let (tx, rx) = pair(true, true);
    let (tx_inbox, rx_inbox) = (Inbox::default(), Inbox::default());
    let t = Duration::from_secs(2);
    let want = payload.to_vec();
    assert_eq!(tx.send_desc(1, &hdr(1, payload.len()), payload, &tx_inbox, t).ok(), Some(Some(0)));
    assert_eq!(recv(&rx, &rx_inbox, key(1)).ok().as_ref(), Some(&want), "read in place");
    let maps = rx.peer(0).map(|p| p.rx_state.lock().map(|st| st.maps.mapped()).unwrap_or(0));
    assert_eq!(maps, Some(mapped as usize), "shareable memory is mapped, other memory is not");
    assert!(tx.wait_sent(1, 0, &tx_inbox, t, &|_| None).is_ok(), "acknowledged");
    // Another wait's descriptor moves into the inbox, read whole.
    assert_eq!(tx.send_desc(1, &hdr(2, payload.len()), payload, &tx_inbox, t).ok(), Some(Some(1)));
    rx.drain(None, &rx_inbox);
    assert_eq!(rx_inbox.try_take(key(2)).map(|f| f.payload).as_ref(), Some(&want), "drained");
    assert!(tx.wait_sent(1, 1, &tx_inbox, t, &|_| None).is_ok());
    // Withdrawn before it was read: the receiver gets an error, not stale bytes; the
    // descriptor before it (another operation's, say) is still read.
    assert_eq!(tx.send_desc(1, &hdr(6, payload.len()), payload, &tx_inbox, t).ok(), Some(Some(2)));
    assert_eq!(tx.send_desc(1, &hdr(3, payload.len()), payload, &tx_inbox, t).ok(), Some(Some(3)));
    tx.withdraw(1, 3, &tx_inbox, t);
    assert_eq!(recv(&rx, &rx_inbox, key(6)).ok().as_ref(), Some(&want), "not withdrawn");
    // Told nothing else about the sender (no failure reaches this inbox), the receiver gives
    // the withdrawal as its error after the grace period, before its own deadline.
    let mut check = |_: &FrameHeader| Ok(());
    let mut ignore = |_: usize, _: &[u8]| {};
    let mut sink = Sink { check: &mut check, out: Out::Pieces(&mut ignore), expect: usize::MAX };
    let e = rx.recv(key(3), &rx_inbox, Duration::from_secs(6), &|_| None, &mut sink).err();
    assert_eq!(e.map(|e| e.kind()), Some(ErrorKind::Remote));
    tx.withdraw(1, 2, &tx_inbox, t);
    // The pair stays in step: plain frames and descriptors go on.
    tx.send(1, &hdr(4, 5), b"hello", &tx_inbox, t).expect("send");
    assert_eq!(recv(&rx, &rx_inbox, key(4)).ok().as_deref(), Some(&b"hello"[..]));
    assert_eq!(tx.send_desc(1, &hdr(5, payload.len()), payload, &tx_inbox, t).ok(), Some(Some(4)));
    assert_eq!(recv(&rx, &rx_inbox, key(5)).ok().as_ref(), Some(&want));
}

#[test]
fn after_a_withdrawn_descriptor_the_rest_of_its_frames_is_never_taken_for_it() {
    // A sender posted two chunks of one wait (the second shorter, as a segment's last) and
    // withdrew the first when its operation failed: the receiver must end its wait with the
    // sender's failure, not take the second chunk for the first (which was refused as a
    // protocol error, excluding a live rank from the next agreement). Read from the ring
    // by the receive itself, and moved by a drain first.
    for drained in [false, true] {
        let (tx, rx) = pair(true, true);
        let (tx_inbox, rx_inbox) = (Inbox::default(), Inbox::default());
        let t = Duration::from_secs(2);
        let (first, last) = (vec![1u8; CMA_MIN * 2], vec![2u8; CMA_MIN]);
        let a = tx.send_desc(1, &hdr(7, first.len()), &first, &tx_inbox, t).ok().flatten();
        let b = tx.send_desc(1, &hdr(7, last.len()), &last, &tx_inbox, t).ok().flatten();
        tx.withdraw(1, a.unwrap_or(0), &tx_inbox, t);
        if drained {
            rx.drain(None, &rx_inbox);
        }
        let mut check = |h: &FrameHeader| match h.len as usize == first.len() {
            true => Ok(()),
            false => Err(Error::new(ErrorKind::Transfer, "took a later chunk for the withdrawn one")),
        };
        let mut ignore = |_: usize, _: &[u8]| {};
        let mut sink = Sink { check: &mut check, out: Out::Pieces(&mut ignore), expect: usize::MAX };
        let e = rx.recv(key(7), &rx_inbox, Duration::from_secs(6), &|_| None, &mut sink).err();
        assert_eq!(e.map(|e| e.kind()), Some(ErrorKind::Remote), "drained={drained}");
        tx.withdraw(1, b.unwrap_or(1), &tx_inbox, t);
        // The pair stays usable for other waits.
        tx.send(1, &hdr(8, 5), b"hello", &tx_inbox, t).expect("send");
        assert_eq!(recv(&rx, &rx_inbox, key(8)).ok().as_deref(), Some(&b"hello"[..]), "drained={drained}");
    }
}

#[test]
fn a_descriptor_where_none_was_agreed_or_of_the_wrong_length_is_a_protocol_error() {
    let (tx, rx) = pair(true, false);
    let (tx_inbox, rx_inbox) = (Inbox::default(), Inbox::default());
    let t = Duration::from_secs(2);
    let payload = vec![1u8; CMA_MIN];
    tx.send_desc(1, &hdr(1, payload.len()), &payload, &tx_inbox, t).expect("send");
    let e = recv(&rx, &rx_inbox, key(1)).err().map(|e| (e.kind(), e.message().to_owned()));
    assert!(e.as_ref().is_some_and(|(k, m)| *k == ErrorKind::Transfer && m.contains("none was agreed")), "{e:?}");

    let (tx, rx) = pair(true, true);
    tx.send_desc(1, &hdr(1, payload.len() + 16), &payload, &tx_inbox, t).expect("send");
    let e = recv(&rx, &rx_inbox, key(1)).err().map(|e| (e.kind(), e.message().to_owned()));
    assert!(e.as_ref().is_some_and(|(k, m)| *k == ErrorKind::Transfer && m.contains("out of step")), "{e:?}");
}

#[test]
fn a_descriptor_of_unreadable_memory_is_a_transfer_error_not_a_crash() {
    let (tx, rx) = pair(true, true);
    let (tx_inbox, rx_inbox) = (Inbox::default(), Inbox::default());
    let t = Duration::from_secs(2);
    let len = CMA_MIN;
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: a fresh private anonymous mapping of `len` bytes, checked for MAP_FAILED.
    let m = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
    assert_ne!(m, libc::MAP_FAILED);
    {
        // SAFETY: the mapping is `len` readable bytes; the slice is gone before the mprotect.
        let payload = unsafe { std::slice::from_raw_parts(m as *const u8, len) };
        tx.send_desc(1, &hdr(1, len), payload, &tx_inbox, t).expect("send");
    }
    // Unreadable but still mapped (unmapped, its addresses could be mapped again by another
    // test thread meanwhile).
    // SAFETY: `m` is the mapping made above, no longer referenced.
    assert_eq!(unsafe { libc::mprotect(m, len, libc::PROT_NONE) }, 0);
    let e = recv(&rx, &rx_inbox, key(1)).err().map(|e| e.kind());
    // SAFETY: as above.
    unsafe { libc::munmap(m, len) };
    assert_eq!(e, Some(ErrorKind::Transfer));
    assert!(tx.wait_sent(1, 0, &tx_inbox, t, &|_| None).is_ok(), "acknowledged all the same");
}

#[test]
fn a_sender_waiting_for_a_dead_reader_gets_an_error() {
    let (tx, _rx) = pair(true, true);
    let tx_inbox = Inbox::default();
    let t = Duration::from_secs(2);
    let payload = vec![1u8; CMA_MIN];
    let index = tx.send_desc(1, &hdr(1, payload.len()), &payload, &tx_inbox, t).ok().flatten();
    tx_inbox.mark_failed(1, crate::transport::Fault::sure("killed"));
    let e = tx.wait_sent(1, index.unwrap_or(0), &tx_inbox, t, &|_| None).err().map(|e| e.kind());
    assert_eq!(e, Some(ErrorKind::RankFailed));
    let e = tx.wait_sent(1, 0, &Inbox::default(), Duration::from_millis(50), &|_| None).err().map(|e| e.kind());
    assert_eq!(e, Some(ErrorKind::Timeout), "nobody reads: the deadline ends the wait");
}

#[test]
fn a_connection_that_reached_another_rank_than_meant_is_refused() {
    // Rank 0 dialled what it took for rank 2's address; rank 1 listens there now (a stale
    // address whose port was taken again): rank 0 must refuse, not wire the mesh wrong.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dialed = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (accepted, _) = listener.accept().expect("accept");
    let host = host_id();
    let cfg = Config { transport: Transport::Tcp, timeout: Duration::from_secs(10), ..Config::default() };
    let (dialer, acceptor) = std::thread::scope(|s| {
        let dialer = s.spawn(|| handshake(&mut [(2, dialed)], 0, 9, &host, &cfg).err());
        let acceptor = s.spawn(|| handshake(&mut [(0, accepted)], 1, 9, &host, &cfg).err());
        (dialer.join().expect("dialer"), acceptor.join().expect("acceptor"))
    });
    let dialer = dialer.expect("rank 0 refuses rank 1 in place of rank 2");
    assert!(dialer.message().contains("meant for world rank 2 reached world rank 1"), "{dialer}");
    // Rank 1 did get rank 0, as it expected: its side is sound, and rank 0's failed init is a
    // failure it sees on that link.
    assert!(acceptor.is_none(), "rank 1 refused the rank it expected: {acceptor:?}");
}

#[test]
fn a_frame_goes_by_descriptor_only_where_a_read_pays_or_its_memory_is_mapped() {
    let heap = vec![7u8; CMA_MIN];
    let mut shared = crate::mem::SharedBuf::new(CMA_MIN).expect("alloc");
    shared.fill(7);
    let (pays, _rx) = pair(true, true);
    assert!(pays.single_copy(1, &heap, Flow::Stored), "a read that pays");
    let (mut costly, _rx) = pair(true, true);
    if let Some(p) = costly.peers[1].get_mut() {
        p.reads_pay = false;
    }
    for flow in [Flow::Stored, Flow::Combined, Flow::Collected] {
        assert!(!costly.single_copy(1, &heap, flow), "{flow:?}: heap memory, a read that costs more than it saves");
        assert!(costly.single_copy(1, &shared, flow), "{flow:?}: mapped memory is read with plain loads");
    }
    let (refused, _rx) = pair(false, false);
    assert!(!refused.single_copy(1, &shared, Flow::Stored), "no reads agreed, not even of mapped memory");
    // Measured once per process: the same verdict every time.
    assert_eq!(reads_pay(), reads_pay());
}
