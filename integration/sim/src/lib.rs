//! Deterministic simulation of a replicated metadata shard.
//!
//! One seed drives a whole run in one thread: 3 to 5 members of one
//! shard's Raft group, each a real [`curvine_actors::engine::Engine`]
//! (LMDB and its log, on tmpfs) whose write side is stepped by the
//! simulator (`curvine_actors::writer::Stepper`) instead of a thread, on a
//! manual [`Clock`] of its own; a simulated network between them (delay,
//! loss, duplication and so reordering, partitions both ways and one way);
//! and a random workload of namespace operations. Faults are drawn from
//! the seed: crashes of a member's process (its engine dropped without a
//! clean stop and opened again, which recovers it from its log), crashes
//! of its machine (as well, LMDB's pages written since its last checkpoint
//! are lost, each or not), crash loops of every member, pauses, partitions,
//! lossy periods, clock jumps, and disk faults ([`DiskFaults`]: a write of
//! the log half done then ENOSPC, a failed sync of the log, a failed flush
//! of LMDB), after which the member's pass fails and its process stops and
//! starts again, as a node's does (status 74). Each member keeps a log
//! window the seed draws (8 to 4,096 entries), so members also catch up by
//! snapshot. raft-rs draws its election timeouts from a random generator
//! of its own: each member's is fixed from the seed instead, all distinct.
//!
//! After the faults heal (in some seeds one member stays down until the
//! shard served: a majority must serve on its own), the run checks what a
//! user would:
//!
//! - every acknowledged create is there and every acknowledged unlink is
//!   gone (on the leader, and on every member once they agree);
//! - an exclusive create of a name that exists never succeeds, a create of
//!   a fresh name never finds it taken and an unlink of a name created
//!   once never finds it gone (no change applied twice, none lost);
//! - nothing is there that no one created;
//! - the shard serves again (a create succeeds) within [`SERVE_BOUND`] of
//!   simulated time, and every member holds the same names.
//!
//! A failing run names its seed; running that seed again (`curvine-sim
//! --seed N`) is the same run; `CURVINE_SIM_TRACE=1` prints its faults.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use curvine_actors::clock::Clock;
use curvine_actors::engine::DiskFaults;
use curvine_messages::{FileKind, FsError, FsResult, NewInode, ROOT_INO};

mod member;
mod net;
mod runner;

pub use runner::{run_seeds, Totals};

use member::Member;
use net::Net;

/// The shard the members replicate.
pub(crate) const SHARD: u16 = 0;
/// Member ids.
const IDS: [u64; 5] = [11, 12, 13, 14, 15];
/// After the faults heal, the shard must serve again within this.
pub const SERVE_BOUND: Duration = Duration::from_secs(15);
/// The finest step of simulated time.
const STEP: Duration = Duration::from_millis(1);

/// What one run does.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Members of the group (3 to 5).
    pub members: usize,
    /// Simulated time during which operations run and faults are injected.
    pub active: Duration,
    /// Mean time between two operations.
    pub op_every: Duration,
    /// Whether faults are injected at all.
    pub faults: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            members: 3,
            active: Duration::from_secs(6),
            op_every: Duration::from_millis(25),
            faults: true,
        }
    }
}

/// What a run did, for the summary line.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub members: usize,
    pub ops: usize,
    pub acknowledged: usize,
    pub crashes: usize,
    pub machine_crashes: usize,
    pub partitions: usize,
    pub pauses: usize,
    pub clock_jumps: usize,
    /// Disk faults armed (each fails the member's next pass that meets it).
    pub disk_faults: usize,
    /// Passes that failed (the member's process stops and is started again).
    pub failed_passes: usize,
    pub messages: u64,
    pub dropped: u64,
    /// Simulated time from the end of the faults until the shard served.
    pub served_after: Duration,
    /// Simulated time the run covered.
    pub simulated: Duration,
    /// A digest of every operation, its member, its times and its answer:
    /// the same seed gives the same digest (the run is deterministic).
    pub digest: u64,
}

fn attrs(now: Duration) -> NewInode {
    NewInode {
        kind: FileKind::File,
        mode: 0o644,
        uid: 0,
        gid: 0,
        symlink: None,
        now_ns: now.as_nanos() as i64,
    }
}

#[derive(Debug, Clone)]
enum Kind {
    /// An exclusive create of a name never used before.
    Create(String),
    /// An exclusive create of a name whose create was acknowledged and
    /// that is never unlinked.
    CreateTaken(String),
    /// An unlink of a name whose create was acknowledged, once.
    Unlink(String),
}

struct Op {
    kind: Kind,
    member: u64,
    invoked: Duration,
    result: Option<(Duration, FsResult<()>)>,
}

type Results = Arc<Mutex<Vec<(usize, FsResult<()>)>>>;

/// One simulated run.
pub struct Sim {
    seed: u64,
    settings: Settings,
    rng: StdRng,
    net: Arc<Mutex<Net>>,
    members: Vec<Member>,
    ids: Vec<u64>,
    t: Duration,
    ops: Vec<Op>,
    results: Results,
    next_op: Duration,
    /// Faults: when each comes, and what it is.
    faults: BTreeMap<(Duration, u64), Fault>,
    report: Report,
    _dir: tempfile::TempDir,
}

#[derive(Debug, Clone)]
enum Fault {
    Crash {
        member: usize,
        machine: bool,
        down: Duration,
    },
    Pause {
        member: usize,
        dur: Duration,
    },
    Partition {
        member: usize,
        dur: Duration,
    },
    /// Every member crashes (each its process or its machine), all start
    /// again after `down`, and `again` later all crash once more (a crash
    /// loop: an operator or a power supply restarting twice).
    CrashAll {
        down: Duration,
        again: Option<Duration>,
    },
    /// Only what the member sends is lost (`outgoing`), or only what it
    /// receives: a deposed leader then hears its successor before it
    /// notices it lost its quorum.
    OneWay {
        member: usize,
        outgoing: bool,
        dur: Duration,
    },
    Heal {
        member: usize,
    },
    Lossy {
        loss: f64,
        dup: f64,
        dur: Duration,
    },
    Calm,
    ClockJump {
        member: usize,
        by: Duration,
    },
    /// The next write or sync of the member's log, or flush of its LMDB
    /// data file, fails ([`DiskFaults`]).
    Disk {
        member: usize,
        fault: u8,
    },
}

impl Sim {
    pub fn new(seed: u64, settings: Settings) -> Result<Sim, String> {
        let mut rng = StdRng::seed_from_u64(seed);
        let n = settings.members.clamp(3, IDS.len());
        let ids: Vec<u64> = IDS[..n].to_vec();
        let net = Arc::new(Mutex::new(Net {
            rng: StdRng::seed_from_u64(rng.gen()),
            now: Duration::ZERO,
            queue: BinaryHeap::new(),
            pending: BTreeMap::new(),
            seq: 0,
            cut: BTreeSet::new(),
            loss: 0.0,
            dup: 0.0,
            max_delay: Duration::from_millis(rng.gen_range(1..=20)),
            sent: 0,
            dropped: 0,
        }));
        let base = Path::new("/dev/shm");
        let dir = if base.is_dir() {
            tempfile::Builder::new()
                .prefix("curvine-sim")
                .tempdir_in(base)
        } else {
            tempfile::Builder::new().prefix("curvine-sim").tempdir()
        }
        .map_err(|e| format!("temporary directory: {e}"))?;
        let log_window = [8, 16, 64, 4096][rng.gen_range(0..4)];
        // Election timeouts, distinct: raft-rs draws a new one at each
        // reset, which breaks ties between candidates; fixed ones that
        // were equal would tie for ever.
        let mut ticks: Vec<usize> = (10..20).collect();
        for i in (1..ticks.len()).rev() {
            ticks.swap(i, rng.gen_range(0..=i));
        }
        let mut members = Vec::new();
        for (&id, &election_tick) in ids.iter().zip(&ticks) {
            members.push(Member {
                id,
                dir: dir.path().join(format!("m{id}")),
                clock: Clock::manual(),
                ahead: Duration::ZERO,
                election_tick,
                log_window,
                live: None,
                paused_until: Duration::ZERO,
                down_until: None,
                synced: None,
            });
        }
        let mut sim = Sim {
            seed,
            rng,
            net,
            members,
            ids,
            t: Duration::ZERO,
            ops: Vec::new(),
            results: Arc::default(),
            next_op: Duration::ZERO,
            faults: BTreeMap::new(),
            report: Report {
                members: n,
                ..Report::default()
            },
            settings,
            _dir: dir,
        };
        for i in 0..sim.members.len() {
            let ids = sim.ids.clone();
            sim.members[i].open(&ids, &sim.net)?;
        }
        if sim.settings.faults {
            sim.plan_faults();
        }
        Ok(sim)
    }

    fn plan_faults(&mut self) {
        let n = self.members.len();
        let active = self.settings.active;
        let mut at = Duration::from_millis(self.rng.gen_range(200..1500));
        let mut k = 0u64;
        while at < active {
            let member = self.rng.gen_range(0..n);
            let fault = match self.rng.gen_range(0..100) {
                0..=4 => Fault::CrashAll {
                    down: Duration::from_millis(self.rng.gen_range(0..1500)),
                    again: self
                        .rng
                        .gen_bool(0.6)
                        .then(|| Duration::from_millis(self.rng.gen_range(100..1200))),
                },
                5..=29 => Fault::Crash {
                    member,
                    machine: self.rng.gen_bool(0.3),
                    down: Duration::from_millis(self.rng.gen_range(0..2500)),
                },
                30..=44 => Fault::Pause {
                    member,
                    dur: Duration::from_millis(self.rng.gen_range(100..3000)),
                },
                45..=54 => Fault::OneWay {
                    member,
                    outgoing: self.rng.gen_bool(0.7),
                    dur: Duration::from_millis(self.rng.gen_range(100..4000)),
                },
                55..=69 => Fault::Partition {
                    member,
                    dur: Duration::from_millis(self.rng.gen_range(100..4000)),
                },
                70..=79 => Fault::Disk {
                    member,
                    fault: [
                        DiskFaults::LOG_WRITE,
                        DiskFaults::LOG_SYNC,
                        DiskFaults::DATA_FLUSH,
                    ][self.rng.gen_range(0..3)],
                },
                80..=89 => Fault::Lossy {
                    loss: self.rng.gen_range(0.0..0.4),
                    dup: self.rng.gen_range(0.0..0.2),
                    dur: Duration::from_millis(self.rng.gen_range(100..3000)),
                },
                _ => Fault::ClockJump {
                    member,
                    by: Duration::from_millis(self.rng.gen_range(50..5000)),
                },
            };
            k += 1;
            self.faults.insert((at, k), fault);
            at += Duration::from_millis(self.rng.gen_range(50..1500));
        }
    }

    fn err(&self, what: impl std::fmt::Display) -> String {
        format!("seed {} at {:.3}s: {what}", self.seed, self.t.as_secs_f64())
    }

    /// Runs the seed: operations under faults, then healing, then the
    /// checks.
    pub fn run(mut self) -> Result<Report, String> {
        let active = self.settings.active;
        while self.t < active {
            self.advance(active, true)?;
        }
        // Heal: every link, every member up and running, no loss; in some
        // seeds one member stays down until the shard served (a majority
        // must serve on its own).
        let healed_at = self.t;
        let away = self
            .rng
            .gen_bool(0.4)
            .then(|| self.rng.gen_range(0..self.members.len()));
        if let Some(i) = away {
            let m = &mut self.members[i];
            m.crash(false, &mut self.rng)
                .map_err(|e| format!("seed {}: {e}", self.seed))?;
            m.down_until = None;
        }
        {
            let mut net = self.net.lock().unwrap();
            net.cut.clear();
            net.loss = 0.0;
            net.dup = 0.0;
        }
        self.faults.clear();
        for i in 0..self.members.len() {
            self.members[i].paused_until = Duration::ZERO;
            if self.members[i].live.is_none() && away != Some(i) {
                self.members[i].down_until = None;
                let ids = self.ids.clone();
                let net = self.net.clone();
                self.members[i].open(&ids, &net).map_err(|e| self.err(e))?;
            }
        }
        // The shard serves again: a create of a fresh name succeeds.
        let deadline = healed_at + SERVE_BOUND;
        let mut probe: Option<usize> = None;
        let mut probes = 0;
        let served = loop {
            if let Some(i) = probe {
                if let Some((at, r)) = &self.ops[i].result {
                    if r.is_ok() {
                        break *at;
                    }
                    probe = None;
                }
            }
            if probe.is_none()
                || self.t >= self.ops[probe.unwrap()].invoked + Duration::from_secs(2)
            {
                probes += 1;
                probe = Some(self.submit(Kind::Create(format!("probe-{probes}"))));
            }
            if self.t >= deadline {
                let states: Vec<String> = self
                    .members
                    .iter()
                    .map(|m| match &m.live {
                        None => format!("{}: down", m.id),
                        Some(l) => format!(
                            "{}: {:?}",
                            m.id,
                            l.writer.status().lock().unwrap().get(&SHARD)
                        ),
                    })
                    .collect();
                return Err(self.err(format!(
                    "the shard does not serve {:?} after the faults healed; members: {}",
                    SERVE_BOUND,
                    states.join("; ")
                )));
            }
            let until = self.t + Duration::from_millis(50);
            while self.t < until {
                self.advance(until, false)?;
            }
        };
        self.report.served_after = served.saturating_sub(healed_at);
        if let Some(i) = away {
            let ids = self.ids.clone();
            let net = self.net.clone();
            self.members[i].open(&ids, &net).map_err(|e| self.err(e))?;
        }
        // Let every member catch up, then check.
        let settle = self.t + Duration::from_secs(3);
        while self.t < settle {
            self.advance(settle, false)?;
        }
        self.check()?;
        self.report.simulated = self.t;
        {
            let net = self.net.lock().unwrap();
            self.report.messages = net.sent;
            self.report.dropped = net.dropped;
        }
        self.report.ops = self.ops.len();
        // FNV-1a over the history.
        let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
        for op in &self.ops {
            // Errors by kind: their messages name the run's directory.
            let result = op
                .result
                .as_ref()
                .map(|(at, r)| (at, r.as_ref().map_err(|e| e.errno())));
            let line = format!("{:?} {} {:?} {result:?}", op.kind, op.member, op.invoked);
            for b in line.bytes() {
                digest = (digest ^ b as u64).wrapping_mul(0x0100_0000_01b3);
            }
        }
        self.report.digest = digest;
        self.report.acknowledged = self
            .ops
            .iter()
            .filter(|o| matches!(o.result, Some((_, Ok(())))))
            .count();
        Ok(self.report)
    }

    /// The next moment something happens, at least one step on.
    fn next_event(&self, limit: Duration, ops: bool) -> Duration {
        let mut next = limit;
        if let Some(at) = self.net.lock().unwrap().next() {
            next = next.min(at);
        }
        if let Some(((at, _), _)) = self.faults.first_key_value() {
            next = next.min(*at);
        }
        if ops {
            next = next.min(self.next_op);
        }
        for m in &self.members {
            if let Some(live) = &m.live {
                let wake = live.stepper.wake().saturating_duration_since(m.clock.now());
                next = next.min(m.paused_until.max(self.t + wake.saturating_sub(m.ahead)));
            }
            if let Some(up) = m.down_until {
                next = next.min(up);
            }
        }
        next.max(self.t + STEP)
    }

    /// Moves to the next event (at most `limit`) and runs what is due.
    fn advance(&mut self, limit: Duration, active: bool) -> Result<(), String> {
        self.t = self.next_event(limit, active).min(limit.max(self.t + STEP));
        let t = self.t;
        for m in &self.members {
            m.clock.advance_to(m.now(t));
        }
        self.net.lock().unwrap().now = t;
        // Faults due.
        while let Some(entry) = self.faults.first_entry() {
            if entry.key().0 > t {
                break;
            }
            let fault = entry.remove();
            self.inject(fault)?;
        }
        // Members due back.
        for i in 0..self.members.len() {
            if self.members[i].down_until.is_some_and(|up| up <= t) {
                self.members[i].down_until = None;
                let ids = self.ids.clone();
                let net = self.net.clone();
                self.members[i].open(&ids, &net).map_err(|e| self.err(e))?;
            }
        }
        // Messages due.
        let due = self.net.lock().unwrap().due(t);
        for (_, to, messages) in due {
            if let Some(live) = self
                .members
                .iter()
                .find(|m| m.id == to)
                .and_then(|m| m.live.as_ref())
            {
                live.inbox.deliver(messages);
            }
        }
        // Operations due.
        if active && self.next_op <= t {
            self.next_op = t + Duration::from_micros(
                self.rng
                    .gen_range(0..=2 * self.settings.op_every.as_micros() as u64),
            );
            let kind = self.pick_op();
            self.submit(kind);
        }
        // Each running member, in an order the seed draws.
        let mut order: Vec<usize> = (0..self.members.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, self.rng.gen_range(0..=i));
        }
        for i in order {
            let m = &mut self.members[i];
            if m.paused_until > t {
                continue;
            }
            let Some(live) = m.live.as_mut() else {
                continue;
            };
            if live.stepper.step().is_err() {
                // The process stops (status 74) and is started again.
                m.crash(false, &mut self.rng)
                    .map_err(|e| format!("seed {}: {e}", self.seed))?;
                m.down_until = Some(t + Duration::from_millis(100));
                self.report.failed_passes += 1;
                continue;
            }
            m.note_checkpoint();
        }
        let done: Vec<(usize, FsResult<()>)> = std::mem::take(&mut *self.results.lock().unwrap());
        for (i, r) in done {
            if self.ops[i].result.is_none() {
                self.ops[i].result = Some((t, r));
            }
        }
        Ok(())
    }

    fn inject(&mut self, fault: Fault) -> Result<(), String> {
        let t = self.t;
        if std::env::var_os("CURVINE_SIM_TRACE").is_some() {
            eprintln!("{:.3}s {fault:?}", t.as_secs_f64());
            for m in &self.members {
                if let Some(l) = &m.live {
                    eprintln!(
                        "    {}: {:?}",
                        m.id,
                        l.writer.status().lock().unwrap().get(&SHARD)
                    );
                }
            }
        }
        let k = self.faults.len() as u64 + 1_000_000;
        match fault {
            Fault::Crash {
                member,
                machine,
                down,
            } => {
                let m = &mut self.members[member];
                if m.live.is_some() {
                    m.crash(machine, &mut self.rng)
                        .map_err(|e| format!("seed {}: {e}", self.seed))?;
                    m.down_until = Some(t + down);
                    self.report.crashes += 1;
                    if machine {
                        self.report.machine_crashes += 1;
                    }
                }
            }
            Fault::CrashAll { down, again } => {
                for i in 0..self.members.len() {
                    let machine = self.rng.gen_bool(0.3);
                    let m = &mut self.members[i];
                    if m.live.is_some() {
                        m.crash(machine, &mut self.rng)
                            .map_err(|e| format!("seed {}: {e}", self.seed))?;
                        self.report.crashes += 1;
                        self.report.machine_crashes += machine as usize;
                    }
                    m.down_until = Some(t + down);
                }
                if let Some(again) = again {
                    let fault = Fault::CrashAll { down, again: None };
                    self.faults.insert((t + down + again, k), fault);
                }
            }
            Fault::Pause { member, dur } => {
                self.members[member].paused_until = t + dur;
                self.report.pauses += 1;
            }
            Fault::Partition { member, dur } => {
                let id = self.members[member].id;
                let mut net = self.net.lock().unwrap();
                for &other in &self.ids {
                    if other != id {
                        net.cut.insert((id, other));
                        net.cut.insert((other, id));
                    }
                }
                drop(net);
                self.faults.insert((t + dur, k), Fault::Heal { member });
                self.report.partitions += 1;
            }
            Fault::OneWay {
                member,
                outgoing,
                dur,
            } => {
                let id = self.members[member].id;
                let mut net = self.net.lock().unwrap();
                for &other in &self.ids {
                    if other != id {
                        net.cut
                            .insert(if outgoing { (id, other) } else { (other, id) });
                    }
                }
                drop(net);
                self.faults.insert((t + dur, k), Fault::Heal { member });
                self.report.partitions += 1;
            }
            Fault::Heal { member } => {
                let id = self.members[member].id;
                self.net
                    .lock()
                    .unwrap()
                    .cut
                    .retain(|&(a, b)| a != id && b != id);
            }
            Fault::Lossy { loss, dup, dur } => {
                let mut net = self.net.lock().unwrap();
                net.loss = loss;
                net.dup = dup;
                drop(net);
                self.faults.insert((t + dur, k), Fault::Calm);
            }
            Fault::Calm => {
                let mut net = self.net.lock().unwrap();
                net.loss = 0.0;
                net.dup = 0.0;
            }
            Fault::Disk { member, fault } => {
                if let Some(live) = &self.members[member].live {
                    live.store.engine().faults().arm(fault);
                    self.report.disk_faults += 1;
                }
            }
            Fault::ClockJump { member, by } => {
                self.members[member].ahead += by;
                let m = &self.members[member];
                m.clock.advance_to(m.now(t));
                self.report.clock_jumps += 1;
            }
        }
        Ok(())
    }

    /// Names whose create was acknowledged, and which an unlink was or
    /// was not asked of.
    fn acked_names(&self) -> (Vec<String>, BTreeSet<String>, BTreeSet<String>) {
        let mut acked = Vec::new();
        let mut unlinked = BTreeSet::new();
        let mut taken = BTreeSet::new();
        for op in &self.ops {
            match &op.kind {
                Kind::Create(name) if matches!(op.result, Some((_, Ok(())))) => {
                    acked.push(name.clone())
                }
                Kind::Unlink(name) => {
                    unlinked.insert(name.clone());
                }
                Kind::CreateTaken(name) => {
                    taken.insert(name.clone());
                }
                _ => {}
            }
        }
        (acked, unlinked, taken)
    }

    fn pick_op(&mut self) -> Kind {
        let (acked, unlinked, taken) = self.acked_names();
        let roll = self.rng.gen_range(0..100);
        if roll < 25 {
            let free: Vec<&String> = acked
                .iter()
                .filter(|n| !unlinked.contains(*n) && !taken.contains(*n))
                .collect();
            if !free.is_empty() {
                let name = free[self.rng.gen_range(0..free.len())].clone();
                return Kind::Unlink(name);
            }
        } else if roll < 35 {
            let kept: Vec<&String> = acked.iter().filter(|n| !unlinked.contains(*n)).collect();
            if !kept.is_empty() {
                let name = kept[self.rng.gen_range(0..kept.len())].clone();
                return Kind::CreateTaken(name);
            }
        }
        Kind::Create(format!("f{}", self.ops.len()))
    }

    /// Submits an operation to the member that believes it leads (any
    /// running member when none does); its index.
    fn submit(&mut self, kind: Kind) -> usize {
        let id = self.ops.len();
        let serving: Vec<usize> = (0..self.members.len())
            .filter(|&i| {
                self.members[i].live.as_ref().is_some_and(|l| {
                    l.writer
                        .status()
                        .lock()
                        .unwrap()
                        .get(&SHARD)
                        .is_some_and(|s| s.serving)
                })
            })
            .collect();
        let running: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].live.is_some())
            .collect();
        let pool = if serving.is_empty() {
            &running
        } else {
            &serving
        };
        let invoked = self.t;
        let Some(&i) = (!pool.is_empty()).then(|| &pool[self.rng.gen_range(0..pool.len())]) else {
            self.ops.push(Op {
                kind,
                member: 0,
                invoked,
                result: Some((invoked, Err(FsError::Unavailable("no member runs".into())))),
            });
            return id;
        };
        let m = &self.members[i];
        let live = m.live.as_ref().unwrap();
        let store = live.store.clone();
        let results = self.results.clone();
        let now = m.now(self.t);
        let reply = move |r: FsResult<()>| results.lock().unwrap().push((id, r));
        match kind.clone() {
            Kind::Create(name) | Kind::CreateTaken(name) => live.writer.submit(
                move |w| {
                    store
                        .create(w, ROOT_INO, &name, &attrs(now), None)
                        .map(drop)
                },
                reply,
            ),
            Kind::Unlink(name) => live
                .writer
                .submit(move |w| store.unlink(w, ROOT_INO, &name).map(drop), reply),
        }
        self.ops.push(Op {
            kind,
            member: m.id,
            invoked,
            result: None,
        });
        id
    }

    /// The names in the root of a member's LMDB.
    fn names(&self, m: &Member) -> Result<BTreeSet<String>, String> {
        let live = m.live.as_ref().ok_or("not running")?;
        let txn = live.store.read_txn().map_err(|e| e.to_string())?;
        let entries = live
            .store
            .readdir(&txn, ROOT_INO, None, u32::MAX)
            .map_err(|e| e.to_string())?;
        Ok(entries.into_iter().map(|e| e.name).collect())
    }

    fn check(&self) -> Result<(), String> {
        let leader = self
            .members
            .iter()
            .find(|m| {
                m.live.as_ref().is_some_and(|l| {
                    l.writer
                        .status()
                        .lock()
                        .unwrap()
                        .get(&SHARD)
                        .is_some_and(|s| s.serving)
                })
            })
            .ok_or_else(|| self.err("no member serves at the end"))?;
        let names = self.names(leader).map_err(|e| self.err(e))?;
        let (_, unlinked, _) = self.acked_names();
        let invoked: BTreeSet<&str> = self
            .ops
            .iter()
            .map(|o| match &o.kind {
                Kind::Create(n) | Kind::CreateTaken(n) | Kind::Unlink(n) => n.as_str(),
            })
            .collect();
        for (i, op) in self.ops.iter().enumerate() {
            let Some((at, result)) = &op.result else {
                continue;
            };
            let what = format!(
                "op {i} {:?} on member {} (asked at {:.3}s, answered at {:.3}s)",
                op.kind,
                op.member,
                op.invoked.as_secs_f64(),
                at.as_secs_f64()
            );
            match (&op.kind, result) {
                (Kind::Create(name), Ok(()))
                    if !unlinked.contains(name) && !names.contains(name) =>
                {
                    return Err(self.err(format!("{what} was acknowledged and is gone")));
                }
                (Kind::Create(_), Err(FsError::AlreadyExists(_))) => {
                    return Err(self.err(format!("{what}: a fresh name was found taken")));
                }
                (Kind::CreateTaken(_), Ok(())) => {
                    return Err(self.err(format!("{what}: an existing name was created again")));
                }
                (Kind::Unlink(name), Ok(())) if names.contains(name) => {
                    return Err(self.err(format!("{what} was acknowledged and the name is back")));
                }
                (Kind::Unlink(_), Err(FsError::NotFound(_))) => {
                    return Err(self.err(format!("{what}: a name created once was already gone")));
                }
                _ => {}
            }
        }
        if let Some(stray) = names.iter().find(|n| !invoked.contains(n.as_str())) {
            return Err(self.err(format!("{stray} is there and nobody created it")));
        }
        for m in &self.members {
            let theirs = self.names(m).map_err(|e| self.err(e))?;
            if theirs != names {
                let missing: Vec<_> = names.difference(&theirs).take(5).collect();
                let extra: Vec<_> = theirs.difference(&names).take(5).collect();
                let status = |m: &Member| {
                    m.live
                        .as_ref()
                        .and_then(|l| l.writer.status().lock().unwrap().get(&SHARD).cloned())
                };
                return Err(self.err(format!(
                    "member {} disagrees with the leader {}: lacks {missing:?}, has {extra:?} ({} names against {}; its group {:?}; the leader's {:?})",
                    m.id, leader.id, theirs.len(), names.len(), status(m), status(leader)
                )));
            }
        }
        Ok(())
    }
}

/// Runs one seed. A panic in it (raft-rs panics when a member's log
/// lacks what it acknowledged, for one) fails the seed.
pub fn run_seed(seed: u64, settings: &Settings) -> Result<Report, String> {
    let settings = settings.clone();
    std::panic::catch_unwind(move || Sim::new(seed, settings)?.run()).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        Err(format!("seed {seed}: panicked: {what}"))
    })
}
