//! The receiving side of the rings: a receive takes its frame from the ring of its peer (or from
//! the inbox, where another wait moved it), moving frames of other waits into the inbox.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::*;
use crate::transport::wait::{futex_wait, NAP};

impl Shm {
    /// Receives the frame `key` (its source has a shared-memory link): from the inbox if another
    /// wait moved it there, else straight from the ring.
    pub fn recv(
        &self,
        key: Key,
        inbox: &Inbox,
        timeout: Duration,
        status: &dyn Fn(&Health<'_>) -> Option<Error>,
        sink: &mut Sink<'_, '_>,
    ) -> Result<()> {
        let Some(p) = self.peer(key.src) else { return Err(Error::internal("no shared memory to that rank")) };
        let deadline = Instant::now() + timeout;
        let mut gen = u64::MAX;
        let mut backoff = self.backoff();
        let mut ended: Option<Error> = None;
        let mut withdrawn: Option<Instant> = None;
        loop {
            let g = inbox.generation();
            if g != gen {
                gen = g;
                if inbox.queued() > 0 && withdrawn.is_none() {
                    if let Some(f) = inbox.try_take(key) {
                        (sink.check)(&f.hdr)?;
                        sink.piece(0, &f.payload);
                        crate::transport::pool::give(f.payload);
                        return Ok(());
                    }
                }
                // Noted now, returned only after one more look at the ring below: what the
                // peer wrote before it died or left is still delivered. (Frames of others wait
                // in the inbox too: they may show that this wait is in vain.)
                if inbox.health_changes() != 0 || inbox.queued() > 0 {
                    ended = inbox.ended(key.src, status);
                    if withdrawn.is_none() && inbox.given_up(key) {
                        withdrawn = Some(Instant::now());
                    }
                }
            }
            // Once the sender withdrew a frame of ours, its later ones must not be taken for it.
            if withdrawn.is_none() {
                if let Ok(mut st) = p.rx_state.try_lock() {
                    match self.poll(p, &mut st, key, inbox, deadline, sink)? {
                        Polled::Done => return Ok(()),
                        Polled::Progress => {
                            backoff.reset();
                            continue;
                        }
                        Polled::Nothing => {}
                        Polled::Withdrawn => {
                            inbox.give_up(key);
                            withdrawn = Some(Instant::now());
                        }
                    }
                }
            }
            if let Some(e) = ended.take() {
                // The ring had one more look above: what the peer wrote before it died or left
                // is delivered; nothing more will come.
                return Err(e);
            }
            if withdrawn.is_some_and(|t| t.elapsed() >= crate::transport::WITHDRAW_GRACE) {
                return Err(Error::new(
                    ErrorKind::Remote,
                    format!("world rank {} gave up its operation before this rank read its data", key.src),
                ));
            }
            if backoff.step() {
                if Instant::now() >= deadline {
                    return Err(Error::timeout(format!(
                        "no message from world rank {} within {} ms (HCCN_TIMEOUT_MS)",
                        key.src,
                        timeout.as_millis()
                    )));
                }
                self.drain(Some(key.src), inbox);
                if withdrawn.is_some() {
                    // Only news can end this wait now; the ring may hold the rest of the frame.
                    std::thread::sleep(NAP);
                    continue;
                }
                let ring = &p.rx;
                let seen = ring.data_word().load(Ordering::SeqCst);
                ring.data_sleepers().fetch_add(1, Ordering::SeqCst);
                if !ring.ready(ring.tail().load(Ordering::Relaxed), Ordering::SeqCst) && inbox.generation() == gen {
                    futex_wait(ring.data_word(), seen, NAP);
                }
                ring.data_sleepers().fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Looks at `p`'s ring once: delivers `key` if it is next, moves other frames to the inbox.
    fn poll(
        &self,
        p: &ShmPeer,
        st: &mut RxState,
        key: Key,
        inbox: &Inbox,
        deadline: Instant,
        sink: &mut Sink<'_, '_>,
    ) -> Result<Polled> {
        let ring = &p.rx;
        if st.partial.is_some() {
            // Another frame is half moved; finish it first (the sender is streaming it).
            return match fill(p, st, key.src, inbox)? {
                true => Ok(Polled::Progress),
                false => Ok(Polled::Nothing),
            };
        }
        let mut t = ring.tail().load(Ordering::Relaxed);
        if !ring.ready(t, Ordering::Acquire) {
            return Ok(Polled::Nothing);
        }
        let (raw, len, desc) = ring.piece(t);
        let raw = raw.ok_or_else(out_of_step)?;
        let hdr = header(&raw, key.src)?;
        let this = Key { src: key.src, kind: hdr.kind, comm_id: hdr.comm_id, seq: hdr.seq };
        if this != key {
            // Another wait's frame: into the inbox with it (what has arrived of it, for now).
            fill(p, st, key.src, inbox)?;
            return Ok(Polled::Progress);
        }
        if desc {
            let d = descriptor(p, st, t, len, &hdr)?;
            (sink.check)(&hdr)?;
            ring.release(t);
            st.cma_next += 1;
            return match cma_take(p, st, key.src, d, inbox, &mut sink.out)? {
                true => Ok(Polled::Done),
                false => Ok(Polled::Withdrawn),
            };
        }
        (sink.check)(&hdr)?;
        let total = hdr.len as usize;
        sink.piece(0, ring.data(t, len));
        let mut off = len;
        ring.release(t);
        t += 1;
        let mut backoff = self.backoff();
        while off < total {
            if !ring.ready(t, Ordering::Acquire) {
                if backoff.step() {
                    // Only the sender's end stops a frame that has begun: leaving it half read
                    // (for a revoke, say) would put the ring out of step for the next receive.
                    if let Some(e) = inbox.peer_gone(key.src) {
                        if !ring.ready(t, Ordering::Acquire) {
                            return Err(e);
                        }
                    }
                    if Instant::now() >= deadline {
                        return Err(Error::timeout(format!("world rank {} stopped inside a frame", key.src)));
                    }
                    let seen = ring.data_word().load(Ordering::SeqCst);
                    ring.data_sleepers().fetch_add(1, Ordering::SeqCst);
                    if !ring.ready(t, Ordering::SeqCst) {
                        futex_wait(ring.data_word(), seen, NAP);
                    }
                    ring.data_sleepers().fetch_sub(1, Ordering::SeqCst);
                }
                continue;
            }
            backoff.reset();
            let (first, len, desc) = ring.piece(t);
            if first.is_some() || desc || off + len > total {
                return Err(out_of_step());
            }
            sink.piece(off, ring.data(t, len));
            off += len;
            ring.release(t);
            t += 1;
        }
        Ok(Polled::Done)
    }

    /// Moves whatever has arrived on the rings (except `except`'s) into the inbox, so that their
    /// senders can go on.
    pub fn drain(&self, except: Option<u32>, inbox: &Inbox) {
        for (src, p) in self.linked() {
            if Some(src) == except || p.rx.head().load(Ordering::Acquire) == p.rx.tail().load(Ordering::Relaxed) {
                continue;
            }
            let Ok(mut st) = p.rx_state.try_lock() else { continue };
            loop {
                match fill(p, &mut st, src, inbox) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        inbox.mark_failed(src, crate::transport::Fault::cut(e.message()));
                        break;
                    }
                }
            }
        }
    }
}

/// Moves available slots of `p`'s ring into the partial frame (starting one if none), pushing it
/// to the inbox when complete; a descriptor's payload is read whole into its frame. True when
/// anything moved.
fn fill(p: &ShmPeer, st: &mut RxState, src: u32, inbox: &Inbox) -> Result<bool> {
    let ring = &p.rx;
    let mut t = ring.tail().load(Ordering::Relaxed);
    let mut moved = false;
    while ring.head().load(Ordering::Acquire) != t {
        let (first, len, desc) = ring.piece(t);
        match (&mut st.partial, first) {
            (None, Some(raw)) if desc => {
                let hdr = header(&raw, src)?;
                let d = descriptor(p, st, t, len, &hdr)?;
                ring.release(t);
                t += 1;
                moved = true;
                st.cma_next += 1;
                let mut buf = crate::transport::pool::take(d.len as usize);
                buf.resize(d.len as usize, 0);
                // A withdrawn descriptor's frame is dropped, and so are the later frames of
                // its wait (its sender's operation failed), which then fails.
                if cma_take(p, st, src, d, inbox, &mut Out::Into(&mut buf))? {
                    st.partial = Some(Partial { hdr, buf });
                } else {
                    inbox.give_up(Key { src, kind: hdr.kind, comm_id: hdr.comm_id, seq: hdr.seq });
                }
            }
            (None, Some(raw)) => {
                let hdr = header(&raw, src)?;
                let mut buf = crate::transport::pool::take(hdr.len as usize);
                buf.extend_from_slice(ring.data(t, len));
                st.partial = Some(Partial { hdr, buf });
                ring.release(t);
                t += 1;
                moved = true;
            }
            (Some(part), None) if !desc && part.buf.len() + len <= part.hdr.len as usize => {
                part.buf.extend_from_slice(ring.data(t, len));
                ring.release(t);
                t += 1;
                moved = true;
            }
            _ => return Err(out_of_step()),
        }
        if let Some(part) = st.partial.take_if(|p| p.buf.len() >= p.hdr.len as usize) {
            inbox.push(src, Frame { hdr: part.hdr, payload: part.buf, landed: false });
            // A thread of ours may sleep on this ring waiting for exactly that frame.
            ring.data_word().fetch_add(1, Ordering::SeqCst);
            if ring.data_sleepers().load(Ordering::SeqCst) > 0 {
                futex_wake(ring.data_word());
            }
        }
    }
    Ok(moved)
}

/// The descriptor in slot `t` (the only slot of its frame), checked against the frame's header,
/// the count of descriptors so far, and the pair's agreement to use them.
fn descriptor(p: &ShmPeer, st: &RxState, t: u64, len: usize, hdr: &FrameHeader) -> Result<Desc> {
    if p.cma_pid.is_none() {
        return Err(Error::new(ErrorKind::Transfer, "a single-copy descriptor in shared memory where none was agreed"));
    }
    match Desc::decode(p.rx.data(t, len)) {
        Some(d) if d.len == hdr.len && d.index == st.cma_next => Ok(d),
        _ => Err(out_of_step()),
    }
}
