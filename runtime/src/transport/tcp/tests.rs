use std::net::TcpListener;
use std::time::Duration;

use super::*;
use crate::error::ErrorKind;
use crate::wire::HEADER_LEN;

fn socket_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (b, _) = listener.accept().expect("accept");
    (a, b)
}

#[test]
fn frames_taken_by_the_receive_and_by_the_reader_arrive_whole_once_and_in_order() {
    // The receive's `pump` and the reader thread race for every frame; whoever wins, the
    // inbox must get each frame once, intact and in order, also when a frame arrives in
    // pieces (then only the reader may take it).
    let (mut tx, inbox, link, cfg) = linked(Duration::from_secs(20));
    const FRAMES: u64 = 300;
    let body = |seq: u64| -> Vec<u8> { (0..(seq * 997) % 70_000).map(|i| (i * 31 + seq) as u8).collect() };
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        for seq in 0..FRAMES {
            let payload = body(seq);
            let hdr = collective(seq, payload.len());
            if seq % 3 == 0 {
                // In pieces, with pauses between them.
                tx.write_all(&hdr.encode()[..10]).expect("write");
                std::thread::sleep(Duration::from_micros(300));
                tx.write_all(&hdr.encode()[10..]).expect("write");
                let half = payload.len() / 2;
                tx.write_all(&payload[..half]).expect("write");
                std::thread::sleep(Duration::from_micros(300));
                tx.write_all(&payload[half..]).expect("write");
            } else {
                send_all(&tx, &hdr.encode(), &payload).expect("send");
            }
        }
        tx
    });
    for seq in 0..FRAMES {
        // Half of the receives wait as for a small frame (the reader stands aside), half
        // as for a large one (the reader races them).
        let poll = |budget, ready: &dyn Fn() -> bool| link.poll(budget, ready, seq % 2 == 0, None);
        let f = inbox.take(key(seq), cfg.timeout, &|_| None, &poll).expect("frame");
        assert_eq!((f.hdr.seq, f.hdr.tag), (seq, 3));
        assert!(f.payload == body(seq), "frame {seq} intact");
    }
    assert_eq!(inbox.queued(), 0);
    drop(writer.join().expect("writer"));
    link.close(None);
}

#[test]
fn frames_queued_back_to_back_arrive_whole_when_one_read_holds_several_or_a_frame_spans_reads() {
    // A receive takes what one `recv` brings (up to FEED_BYTES): several small frames, the
    // start of the next one, or a payload whose large rest it reads straight into place.
    let (tx, inbox, link, cfg) = linked(Duration::from_secs(20));
    let feed = super::rx::FEED_BYTES;
    let sizes = [0, 1, 7, feed - HEADER_LEN - 1, feed - HEADER_LEN, feed - 1, feed, feed + 1, 2 * feed + 5, 70];
    let lens: Vec<usize> = (0..60).map(|i| sizes[i % sizes.len()] + i / sizes.len()).collect();
    let body = |seq: usize| -> Vec<u8> { (0..lens[seq]).map(|i| (i * 7 + seq) as u8).collect() };
    let mut stream = Vec::new();
    for (seq, &len) in lens.iter().enumerate() {
        stream.extend_from_slice(&collective(seq as u64, len).encode());
        stream.extend_from_slice(&body(seq));
    }
    send_all(&tx, &stream, &[]).expect("send");
    for (seq, &len) in lens.iter().enumerate() {
        let poll = |budget, ready: &dyn Fn() -> bool| link.poll(budget, ready, true, None);
        let f = inbox.take(key(seq as u64), cfg.timeout, &|_| None, &poll).expect("frame");
        assert!(f.payload == body(seq), "frame {seq} of {len} bytes intact");
    }
    assert_eq!(inbox.queued(), 0);
    link.close(None);
}

#[test]
fn a_goodbye_read_by_a_polling_receive_with_the_last_frame_ends_the_link_as_a_departure() {
    // One `recv` of the receive brings its frame and the peer's goodbye behind it: the frame
    // is filed, the goodbye is the peer leaving (not failing), and the receive after it learns so.
    let (tx, inbox, link, cfg) = linked(Duration::from_secs(20));
    let mut stream = collective(0, 12).encode().to_vec();
    stream.extend_from_slice(&[5; 12]);
    stream.extend_from_slice(&FrameHeader { len: 0, ..super::GOODBYE }.encode());
    send_all(&tx, &stream, &[]).expect("send");
    let poll = |budget, ready: &dyn Fn() -> bool| link.poll(budget, ready, true, None);
    let f = inbox.take(key(0), cfg.timeout, &|_| None, &poll).expect("the frame before the goodbye");
    assert_eq!(f.payload, [5; 12]);
    let status = |h: &super::super::Health<'_>| {
        h.departed
            .get(&1)
            .map(|_| Error::new(ErrorKind::RankFailed, "departed"))
            .or_else(|| h.failed.get(&1).map(|why| Error::new(ErrorKind::Internal, why.reason.clone())))
    };
    let e = inbox.take(key(1), cfg.timeout, &status, &poll).expect_err("the peer left");
    assert_eq!(e.kind(), ErrorKind::RankFailed, "a departure, not a failure: {e}");
    drop(tx);
    link.close(None);
}

/// A link to world rank 1 over a socket pair, without heartbeats: the peer's end, the
/// inbox, the link and its configuration.
fn linked(timeout: Duration) -> (TcpStream, Arc<Inbox>, Arc<dyn Link>, Config) {
    let (tx, rx) = socket_pair();
    let inbox = Arc::new(Inbox::default());
    let cfg = Config { timeout, heartbeat: Duration::ZERO, ..Config::default() };
    let link = start_link(rx, 1, &inbox, &cfg).expect("link");
    (tx, inbox, link, cfg)
}

fn collective(seq: u64, len: usize) -> FrameHeader {
    FrameHeader { tag: 3, ..FrameHeader::control(FrameKind::Collective, 9, 0, seq, len) }
}

fn key(seq: u64) -> Key {
    Key { src: 1, kind: FrameKind::Collective, comm_id: 9, seq }
}

#[test]
fn large_frames_land_whole_in_the_receive_buffer_and_the_others_still_arrive_in_order() {
    let (mut tx, inbox, link, cfg) = linked(Duration::from_secs(20));
    const FRAMES: u64 = 40;
    let len = |seq: u64| if seq.is_multiple_of(2) { 100_000 + seq as usize * 1000 } else { 40 + seq as usize };
    let body = move |seq: u64| -> Vec<u8> { (0..len(seq)).map(|i| (i as u64 * 7 + seq) as u8).collect() };
    // Each frame is written once its receive polls, so that the reader stands aside.
    let (go, polling) = std::sync::mpsc::channel::<u64>();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        for seq in polling {
            let payload = body(seq);
            tx.write_all(&collective(seq, payload.len()).encode()).expect("write");
            // In pieces, with pauses between them.
            for piece in payload.chunks(30_000) {
                tx.write_all(piece).expect("write");
                std::thread::sleep(Duration::from_micros(300));
            }
        }
    });
    for seq in 0..FRAMES {
        let mut buf = vec![0u8; len(seq)];
        let f = {
            let cell = std::cell::RefCell::new(&mut buf[..]);
            let give_up = || false;
            let direct = (seq % 2 == 0).then(|| DirectRead { key: key(seq), dst: &cell, give_up: &give_up });
            let asked = std::cell::Cell::new(false);
            let poll = |_, ready: &dyn Fn() -> bool| {
                // Longer than TCP_POLL: the frame must arrive while this receive polls. It
                // is written from the first look, once the reader stands aside: asked for
                // before, it could reach the reader first.
                let look = || {
                    if !asked.replace(true) {
                        go.send(seq).expect("writer");
                    }
                    ready()
                };
                link.poll(Duration::from_secs(10), &look, seq % 2 == 1, direct.as_ref())
            };
            inbox.take(key(seq), cfg.timeout, &|_| None, &poll).expect("frame")
        };
        assert_eq!((f.hdr.seq, f.hdr.len), (seq, len(seq) as u64));
        assert_eq!(f.landed, seq % 2 == 0, "frame {seq}: landed only when offered");
        if !f.landed {
            buf.copy_from_slice(&f.payload);
        }
        assert!(buf == body(seq), "frame {seq} intact");
    }
    assert_eq!(inbox.queued(), 0);
    drop(go);
    writer.join().expect("writer");
    link.close(None);
}

#[test]
fn a_small_frame_ahead_of_a_landing_one_is_taken_without_its_follower() {
    // The receive that lands frame 1 finds frame 0 ahead of it in the same write: it files
    // frame 0 with a read that stops at its end, so that frame 1 still lands in place.
    let (tx, inbox, link, cfg) = linked(Duration::from_secs(20));
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let mut stream = collective(0, 40).encode().to_vec();
    stream.extend_from_slice(&[9; 40]);
    stream.extend_from_slice(&collective(1, big.len()).encode());
    stream.extend_from_slice(&big);
    let (go, polling) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        polling.recv().expect("go");
        send_all(&tx, &stream, &[]).expect("send");
        tx
    });
    let mut buf = vec![0u8; big.len()];
    let f = {
        let cell = std::cell::RefCell::new(&mut buf[..]);
        let give_up = || false;
        let direct = DirectRead { key: key(1), dst: &cell, give_up: &give_up };
        let asked = std::cell::Cell::new(false);
        let poll = |_, ready: &dyn Fn() -> bool| {
            let look = || {
                if !asked.replace(true) {
                    go.send(()).expect("writer");
                }
                ready()
            };
            link.poll(Duration::from_secs(10), &look, false, Some(&direct))
        };
        inbox.take(key(1), cfg.timeout, &|_| None, &poll).expect("frame 1")
    };
    assert!(f.landed, "frame 1 landed in place");
    assert!(buf == big, "frame 1 intact");
    let poll = |budget, ready: &dyn Fn() -> bool| link.poll(budget, ready, true, None);
    let first = inbox.take(key(0), cfg.timeout, &|_| None, &poll).expect("frame 0");
    assert_eq!(first.payload, [9; 40]);
    drop(writer.join().expect("writer"));
    link.close(None);
}

#[test]
fn a_receive_that_gives_up_inside_a_frame_never_writes_its_buffer_again_and_the_stream_goes_on() {
    let (tx, inbox, link, cfg) = linked(Duration::from_secs(20));
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8 + 1).collect();
    let (go, polling) = std::sync::mpsc::channel::<()>();
    let (rest, gave_up) = std::sync::mpsc::channel::<()>();
    let writer = {
        let big = big.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            let mut tx = tx;
            polling.recv().expect("receive polls");
            // The receive says so just before it starts to poll; the engine takes a frame that
            // arrives before the receive's poll began (correct, but not what this tests).
            std::thread::sleep(Duration::from_millis(20));
            tx.write_all(&collective(0, big.len()).encode()).expect("write");
            tx.write_all(&big[..50_000]).expect("write");
            gave_up.recv().expect("receive gave up");
            // The rest of that frame, then the next one: the rest is dropped, the next arrives.
            tx.write_all(&big[50_000..]).expect("write");
            let small = b"after the abandoned frame";
            send_all(&tx, &collective(1, small.len()).encode(), small).expect("send");
            tx
        })
    };
    let mut buf = vec![0u8; big.len()];
    let e = {
        let cell = std::cell::RefCell::new(&mut buf[..]);
        let start = Instant::now();
        // Gives up (as at its deadline) once the first part has had time to land.
        let give_up = || start.elapsed() > Duration::from_millis(300);
        let direct = DirectRead { key: key(0), dst: &cell, give_up: &give_up };
        let poll = |_, ready: &dyn Fn() -> bool| {
            let _ = go.send(());
            link.poll(Duration::from_millis(600), ready, false, Some(&direct))
        };
        inbox.take(key(0), Duration::from_millis(500), &|_| None, &poll).expect_err("gave up")
    };
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(buf[..50_000] == big[..50_000], "the first part landed");
    rest.send(()).expect("writer");
    let f = inbox.take(key(1), cfg.timeout, &|_| None, &|b, r| link.poll(b, r, true, None)).expect("next frame");
    assert_eq!(&f.payload[..], &b"after the abandoned frame"[..]);
    assert!(buf[50_000..].iter().all(|&b| b == 0), "the buffer was written after the receive gave up");
    drop(writer.join().expect("writer"));
    link.close(None);
}

#[test]
fn a_receive_whose_last_poll_saw_another_change_still_gets_its_frame_from_the_reader() {
    // The receive polls (the reader stands aside and naps), its last poll ends on some other
    // change in the inbox, and its own frame comes only after it went to sleep: the reader
    // must be awake to take it.
    let (tx, inbox, link, _) = linked(Duration::from_secs(5));
    let (go, went) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        went.recv().expect("go");
        std::thread::sleep(Duration::from_millis(100));
        send_all(&tx, &collective(0, 8).encode(), &[7; 8]).expect("send");
        tx
    });
    let start = Instant::now();
    let first = std::cell::Cell::new(true);
    let poll = |budget: Duration, ready: &dyn Fn() -> bool| {
        if !first.replace(false) {
            return link.poll(budget, ready, true, None);
        }
        // Long enough for the reader to see the poll and nap; ends as if another frame came.
        link.poll(Duration::from_secs(1), &|| start.elapsed() > Duration::from_millis(200), true, None);
        go.send(()).expect("go");
        true
    };
    let f = inbox.take(key(0), Duration::from_secs(5), &|_| None, &poll).expect("the frame, from the reader");
    assert_eq!(f.payload, [7; 8]);
    drop(writer.join().expect("writer"));
    link.close(None);
}

#[test]
fn a_receive_polling_for_a_small_frame_learns_that_the_peer_died_from_the_reader() {
    // The reader stands aside while the receive polls; the end of the stream is still its
    // to find, and the receive must hear of it, not wait out its timeout.
    let (tx, inbox, link, cfg) = linked(Duration::from_secs(60));
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        drop(tx);
    });
    let status =
        |h: &super::super::Health<'_>| h.failed.get(&1).map(|why| Error::rank_failed(vec![1], why.reason.clone()));
    let poll = |budget, ready: &dyn Fn() -> bool| link.poll(budget, ready, true, None);
    let got = inbox.take(key(0), cfg.timeout, &status, &poll);
    killer.join().expect("killer");
    let e = got.expect_err("the peer closed its connection");
    assert_eq!(e.kind(), ErrorKind::RankFailed, "{e}");
    link.close(None);
}

#[test]
fn a_malformed_frame_read_by_a_polling_receive_cuts_the_link_at_once() {
    // The receive that polls reads the garbage itself: the link is cut and the receive hears
    // of it at once, not at its timeout.
    let (tx, inbox, link, cfg) = linked(Duration::from_secs(60));
    send_all(&tx, &[0xff; 64], &[]).expect("send");
    let status =
        |h: &super::super::Health<'_>| h.failed.get(&1).map(|why| Error::rank_failed(vec![1], why.reason.clone()));
    let poll = |budget, ready: &dyn Fn() -> bool| link.poll(budget, ready, true, None);
    let start = Instant::now();
    let e = inbox.take(key(0), cfg.timeout, &status, &poll).expect_err("the link was cut");
    assert_eq!(e.kind(), ErrorKind::RankFailed, "{e}");
    assert!(e.to_string().contains("refused a frame"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(30), "heard of it long before the timeout");
    drop(tx);
    link.close(None);
}

#[test]
fn the_kernel_counts_the_data_segments_a_socket_received_before_any_is_read() {
    use std::io::Write;
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut a = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (b, _) = listener.accept().expect("accept");
    let before = io::data_segments_in(b.as_raw_fd()).expect("TCP_INFO on a connected socket");
    a.write_all(b"any byte is life").expect("write");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while io::data_segments_in(b.as_raw_fd()) == Some(before) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(io::data_segments_in(b.as_raw_fd()), Some(before + 1), "one segment came, none read yet");
}
