//! The simulated job: ranks, their clocks and counters, the event loop, the wire, heartbeats and
//! failures.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::clock::{ns, Nanos, Queue, Rng, Tree};
use super::route::{self, Held, Key, Pending, Summary};
use super::{news, Config, FaultKind, Load, Report};
use crate::comm::agree::{Agreement, Msg, Out, Outcome};
use crate::comm::view::Knowledge;
use crate::transport::heartbeat::watched_in_ring;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Alive,
    Crashed,
    Frozen,
}

/// What travels between ranks (heartbeats apart, which are counted, not sent).
pub(super) enum Wire {
    /// `reporter` lost `lost`; `tree` when it travels along one (see `Spread::Tree`).
    Suspect { reporter: u32, lost: u32, tree: Option<Rc<Tree>> },
    /// A watcher declared the receiver dead.
    Evict,
    /// An agreement message, point to point.
    Agree(Msg),
    /// The coordinator's fan-out, down a tree over its destinations.
    Down { tree: Rc<Tree>, msg: Msg },
    /// The votes of a subtree, up the tree `Down` came by.
    Up { key: Key, tree: Rc<Tree>, sum: Summary },
    /// Knowledge for the coordinator, up the tree over the kept ranks.
    KnowUp(Knowledge),
}

impl Wire {
    fn is_news(&self) -> bool {
        matches!(self, Wire::Suspect { .. } | Wire::Evict)
    }
}

pub(super) enum Event {
    /// A rank's watchdog: heartbeats out, silence checked.
    Tick(u32),
    /// The victim fails.
    Fail(u32),
    /// A watcher's link to a crashed peer reads EOF.
    Eof { at: u32, peer: u32 },
    /// A message reaches a rank's socket.
    Deliver { to: u32, from: u32, wire: Wire },
    /// A rank's CPU takes the next thing it has to do.
    Run(u32),
    /// A rank's `agree()` thread, signalled, is running again.
    Woken(u32),
}

/// What a rank's CPU has to do, in order.
enum Work {
    Read {
        from: u32,
        wire: Wire,
    },
    /// Its `agree()` loop reads what it has learnt.
    Wake,
}

pub(super) struct Rank {
    pub state: State,
    /// Watched peers, and when each was last heard.
    pub watch: Vec<(u32, Nanos)>,
    /// Peers this rank's own links lost.
    pub lost: Vec<u32>,
    /// Ranks others told it they lost.
    pub reported: BTreeSet<u32>,
    /// What the rank's communicator knows (`CommInner::knowledge`).
    pub know: Knowledge,
    pub agreement: Agreement,
    /// In `agree()`: it heard of a failure.
    pub entered: bool,
    /// Agreement messages that came before it entered.
    pub held: Vec<Held>,
    pub wake_pending: bool,
    /// Its CPU is busy until then, and what it has to do next.
    pub busy: Nanos,
    work: VecDeque<Work>,
    running: bool,
    pub sent: u64,
    pub received: u64,
    /// Heartbeat frames and pulses sent before the failure.
    pub beats: u64,
    /// When it first knew of each failed rank.
    pub learnt: Vec<(u32, Nanos)>,
    pub ended_at: Option<Nanos>,
    /// Votes of its subtree being gathered, per ballot and phase.
    pub gather: HashMap<Key, Pending>,
}

pub(super) struct Sim<'a> {
    pub cfg: &'a Config,
    pub now: Nanos,
    q: Queue<Event>,
    rng: Rng,
    pub ranks: Vec<Rank>,
    /// Arrival of the last message on each link (TCP keeps order).
    fifo: HashMap<(u32, u32), Nanos>,
    /// Failed ranks, in order, and when.
    pub failures: Vec<(u32, Nanos)>,
    /// The coordinator's failure was planned (it happens once).
    coordinator_doomed: bool,
    /// Messages on the wire.
    in_flight: u64,
    /// Live ranks whose agreement has not ended.
    open: usize,
    pub detected: Option<Nanos>,
    news_messages: u64,
    agreement_messages: u64,
    steps: u64,
}

impl<'a> Sim<'a> {
    pub fn new(cfg: &'a Config) -> Sim<'a> {
        let n = cfg.ranks;
        let world: Vec<u32> = (0..n).collect();
        let mut rng = Rng::new(cfg.seed);
        let mut q = Queue::new();
        let ranks = (0..n)
            .map(|r| {
                let mut watch: Vec<(u32, Nanos)> =
                    watched_in_ring(r, &world, cfg.watched).into_iter().map(|p| (p, 0)).collect();
                watch.sort_unstable();
                q.push(rng.below(ns(cfg.heartbeat)), Event::Tick(r));
                Rank {
                    state: State::Alive,
                    watch,
                    lost: Vec::new(),
                    reported: BTreeSet::new(),
                    know: Knowledge::default(),
                    agreement: Agreement::new(n, r, false),
                    entered: false,
                    held: Vec::new(),
                    wake_pending: false,
                    busy: 0,
                    work: VecDeque::new(),
                    running: false,
                    sent: 0,
                    received: 0,
                    beats: 0,
                    learnt: Vec::new(),
                    ended_at: None,
                    gather: HashMap::new(),
                }
            })
            .collect();
        if cfg.victim < n {
            q.push(ns(cfg.fail_at), Event::Fail(cfg.victim));
        }
        Sim {
            cfg,
            now: 0,
            q,
            rng,
            ranks,
            fifo: HashMap::new(),
            failures: Vec::new(),
            coordinator_doomed: false,
            in_flight: 0,
            open: n as usize,
            detected: None,
            news_messages: 0,
            agreement_messages: 0,
            steps: 0,
        }
    }

    pub fn run(mut self) -> Report {
        let wall = Instant::now();
        let stop = ns(self.cfg.fail_at + self.cfg.give_up_after);
        while let Some((at, ev)) = self.q.pop() {
            if at > stop {
                break;
            }
            self.now = at;
            self.handle(ev);
            if !self.failures.is_empty() && self.open == 0 && self.in_flight == 0 {
                break;
            }
        }
        self.report(wall.elapsed())
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Tick(r) => self.tick(r),
            Event::Fail(r) => self.fail(r),
            Event::Eof { at, peer } => news::lose(self, at, peer, true),
            Event::Deliver { to, from, wire } => {
                if self.alive(to) {
                    self.queue_work(to, Work::Read { from, wire });
                } else {
                    self.in_flight -= 1;
                }
            }
            Event::Run(r) => self.run_next(r),
            Event::Woken(r) => {
                if self.alive(r) {
                    self.queue_work(r, Work::Wake);
                }
            }
        }
    }

    /// Gives `r`'s CPU something to do after what it has.
    fn queue_work(&mut self, r: u32, w: Work) {
        let rank = &mut self.ranks[r as usize];
        rank.work.push_back(w);
        if !rank.running {
            rank.running = true;
            self.q.push(rank.busy.max(self.now), Event::Run(r));
        }
    }

    fn run_next(&mut self, r: u32) {
        let Some(w) = self.ranks[r as usize].work.pop_front() else {
            self.ranks[r as usize].running = false;
            return;
        };
        match w {
            Work::Read { from, wire } => {
                self.in_flight -= 1;
                self.ranks[r as usize].received += 1;
                self.charge(r, ns(self.cfg.net.overhead));
                self.deliver(r, from, wire);
            }
            Work::Wake => news::wake(self, r),
        }
        let rank = &mut self.ranks[r as usize];
        if rank.state == State::Alive && !rank.work.is_empty() {
            self.q.push(rank.busy.max(self.now), Event::Run(r));
        } else {
            rank.running = false;
        }
    }

    fn deliver(&mut self, to: u32, from: u32, wire: Wire) {
        match wire {
            Wire::Suspect { reporter, lost, tree } => news::suspect(self, to, reporter, lost, tree),
            Wire::Evict => {}
            Wire::Agree(msg) => route::direct(self, to, from, msg),
            Wire::Down { tree, msg } => route::down(self, to, tree, msg),
            Wire::Up { key, tree, sum } => route::up(self, to, from, key, tree, sum),
            Wire::KnowUp(know) => news::merge(self, to, &know),
        }
    }

    pub fn alive(&self, r: u32) -> bool {
        self.ranks[r as usize].state == State::Alive
    }

    /// Rank `r`'s CPU does `cost` of work, after what it was doing.
    pub fn charge(&mut self, r: u32, cost: Nanos) {
        let rank = &mut self.ranks[r as usize];
        rank.busy = rank.busy.max(self.now) + cost;
    }

    /// Sends from `from`'s CPU (after what it is doing) over the link to `to`.
    pub fn send(&mut self, from: u32, to: u32, wire: Wire) {
        self.charge(from, ns(self.cfg.net.overhead));
        let rank = &mut self.ranks[from as usize];
        rank.sent += 1;
        let depart = rank.busy;
        if wire.is_news() {
            self.news_messages += 1;
        } else {
            self.agreement_messages += 1;
        }
        let net = self.cfg.net;
        let mut arrive = depart + self.rng.around(ns(net.latency), ns(net.jitter));
        let last = self.fifo.entry((from, to)).or_insert(0);
        arrive = arrive.max(*last + 1);
        *last = arrive;
        self.in_flight += 1;
        self.q.push(arrive, Event::Deliver { to, from, wire });
    }

    pub fn schedule_wake(&mut self, r: u32) {
        if !std::mem::replace(&mut self.ranks[r as usize].wake_pending, true) {
            self.q.push(self.now + ns(self.cfg.net.wakeup), Event::Woken(r));
        }
    }

    /// Simulated CPU time of one call into a state machine.
    pub fn step_cost(&self) -> Nanos {
        let step = self.cfg.protocol.step;
        ns(step.fixed) + ns(step.per_rank) * u64::from(self.cfg.ranks)
    }

    /// One call into rank `r`'s state machine, charged as the protocol's step cost unless it is
    /// part of an aggregate already charged.
    pub fn step(&mut self, r: u32, charge: bool, call: impl FnOnce(&mut Agreement) -> Vec<Out>) -> Vec<Out> {
        self.steps += 1;
        let outs = call(&mut self.ranks[r as usize].agreement);
        if charge {
            self.charge(r, self.step_cost());
        }
        let rank = &mut self.ranks[r as usize];
        if rank.ended_at.is_none() && rank.agreement.outcome().is_some() {
            rank.ended_at = Some(rank.busy.max(self.now));
            self.open -= 1;
        }
        outs
    }

    fn tick(&mut self, r: u32) {
        if !self.alive(r) {
            return;
        }
        let steady = self.now < ns(self.cfg.fail_at);
        let peers: Vec<u32> = self.ranks[r as usize].watch.iter().map(|&(p, _)| p).collect();
        for &p in &peers {
            // A heartbeat frame on the link and a pulse beside it; stamped at their arrival.
            if steady {
                self.ranks[r as usize].beats += 2;
            }
            let at = self.now + self.rng.around(ns(self.cfg.net.latency), ns(self.cfg.net.jitter));
            if let Some(e) = self.ranks[p as usize].watch.iter_mut().find(|e| e.0 == r) {
                e.1 = e.1.max(at);
            }
        }
        let dead_after = ns(self.cfg.dead_after);
        let silent: Vec<u32> = self.ranks[r as usize]
            .watch
            .iter()
            .filter(|&&(_, heard)| self.now.saturating_sub(heard) > dead_after)
            .map(|&(p, _)| p)
            .collect();
        for p in silent {
            news::lose(self, r, p, false);
        }
        self.q.push(self.now + ns(self.cfg.heartbeat), Event::Tick(r));
    }

    /// `r` crashes or freezes now; on a crash the kernel closes its links to its watchers.
    pub fn fail(&mut self, r: u32) {
        if !self.alive(r) {
            return;
        }
        let rank = &mut self.ranks[r as usize];
        rank.state = if self.cfg.fault == FaultKind::Crash { State::Crashed } else { State::Frozen };
        if rank.ended_at.is_none() {
            self.open -= 1;
        }
        let unread = rank.work.drain(..).filter(|w| matches!(w, Work::Read { .. })).count();
        self.in_flight -= unread as u64;
        self.failures.push((r, self.now));
        if self.cfg.fault == FaultKind::Crash {
            let watchers: Vec<u32> =
                (0..self.cfg.ranks).filter(|&w| self.ranks[w as usize].watch.iter().any(|&(p, _)| p == r)).collect();
            for at in watchers {
                let when = self.now + self.rng.around(ns(self.cfg.net.latency), ns(self.cfg.net.jitter));
                self.q.push(when, Event::Eof { at, peer: r });
            }
        }
    }

    /// For a sender about to send `accepts` ACCEPT messages: if it is the coordinator that must
    /// fail, how many it sends first (half).
    pub fn accepts_before_failing(&mut self, accepts: usize) -> Option<usize> {
        if !self.cfg.coordinator_fails || self.coordinator_doomed || accepts == 0 {
            return None;
        }
        self.coordinator_doomed = true;
        Some(accepts / 2)
    }

    /// `w`'s watched peers again, over the live ring as it sees it.
    pub fn rewatch(&mut self, w: u32) {
        let rank = &self.ranks[w as usize];
        let ring: Vec<u32> = (0..self.cfg.ranks).filter(|r| !rank.lost.contains(r)).collect();
        let old = rank.watch.clone();
        let mut watch: Vec<(u32, Nanos)> = watched_in_ring(w, &ring, self.cfg.watched)
            .into_iter()
            .map(|p| (p, old.iter().find(|e| e.0 == p).map_or(self.now, |e| e.1)))
            .collect();
        watch.sort_unstable();
        self.ranks[w as usize].watch = watch;
    }

    fn report(&self, wall: Duration) -> Report {
        let fail_at = ns(self.cfg.fail_at);
        let since = |t: Nanos| Duration::from_nanos(t.saturating_sub(fail_at));
        let survivors: Vec<&Rank> = self.ranks.iter().filter(|r| r.state == State::Alive).collect();
        let decided = |r: &Rank| match r.agreement.outcome() {
            Some(Outcome::Decided(f)) => Some(f.clone()),
            _ => None,
        };
        let sets: BTreeSet<Vec<u32>> = survivors.iter().filter_map(|r| decided(r)).collect();
        let agreed = if sets.len() == 1 { sets.into_iter().next() } else { None };
        let undecided = survivors.iter().filter(|r| decided(r).is_none()).count();
        let knew = |r: &Rank| {
            let when = self.failures.iter().map(|(f, _)| r.learnt.iter().find(|e| e.0 == *f).map(|e| e.1));
            when.collect::<Option<Vec<Nanos>>>().and_then(|t| t.into_iter().max())
        };
        let latest = |each: Vec<Option<Nanos>>| each.into_iter().collect::<Option<Vec<_>>>()?.into_iter().max();
        Report {
            detected: self.detected.map(since),
            all_know: latest(survivors.iter().map(|r| knew(r)).collect()).map(since),
            all_decided: if undecided == 0 {
                latest(survivors.iter().map(|r| r.ended_at).collect()).map(since)
            } else {
                None
            },
            failed: self.failures.iter().map(|f| f.0).collect(),
            wrongly_excluded: agreed.iter().flatten().copied().filter(|&r| self.alive(r)).collect(),
            agreed,
            undecided,
            news_messages: self.news_messages,
            agreement_messages: self.agreement_messages,
            sent: self.load(|r| r.sent as f64),
            received: self.load(|r| r.received as f64),
            load: self.load(|r| (r.sent + r.received) as f64),
            beats_per_second: self.load(|r| r.beats as f64 / self.cfg.fail_at.as_secs_f64()),
            steps: self.steps,
            wall,
        }
    }

    fn load(&self, of: impl Fn(&Rank) -> f64) -> Load {
        let each: Vec<f64> = self.ranks.iter().map(of).collect();
        let (busiest, max) = each.iter().enumerate().fold((0, 0.0), |m, (r, &v)| if v > m.1 { (r, v) } else { m });
        let mean = each.iter().sum::<f64>() / each.len().max(1) as f64;
        Load { max: max.round() as u64, busiest: busiest as u32, mean }
    }
}
