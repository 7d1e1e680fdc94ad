//! The simulated network between members: each message (a batch of Raft
//! messages) arrives after a delay the seed draws, or is lost, or arrives
//! twice; cut links drop everything.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

use curvine_actors::replica::{GroupMessage, Transport};

/// Messages in flight between members.
pub(crate) struct Net {
    pub(crate) rng: StdRng,
    pub(crate) now: Duration,
    pub(crate) queue: BinaryHeap<Reverse<(Duration, u64)>>,
    pub(crate) pending: BTreeMap<u64, (u64, u64, Vec<GroupMessage>)>,
    pub(crate) seq: u64,
    /// Directed links that drop everything.
    pub(crate) cut: BTreeSet<(u64, u64)>,
    pub(crate) loss: f64,
    pub(crate) dup: f64,
    pub(crate) max_delay: Duration,
    pub(crate) sent: u64,
    pub(crate) dropped: u64,
}

impl Net {
    pub(crate) fn send(&mut self, from: u64, to: u64, messages: Vec<GroupMessage>) {
        self.sent += 1;
        if self.cut.contains(&(from, to)) || (self.loss > 0.0 && self.rng.gen_bool(self.loss)) {
            self.dropped += 1;
            return;
        }
        let copies = if self.dup > 0.0 && self.rng.gen_bool(self.dup) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = self
                .rng
                .gen_range(Duration::from_micros(100)..=self.max_delay);
            self.seq += 1;
            self.queue.push(Reverse((self.now + delay, self.seq)));
            self.pending.insert(self.seq, (from, to, messages.clone()));
        }
    }

    pub(crate) fn next(&self) -> Option<Duration> {
        self.queue.peek().map(|Reverse((at, _))| *at)
    }

    /// The messages due by `now`, in the order they arrive.
    pub(crate) fn due(&mut self, now: Duration) -> Vec<(u64, u64, Vec<GroupMessage>)> {
        let mut out = Vec::new();
        while let Some(Reverse((at, seq))) = self.queue.peek().copied() {
            if at > now {
                break;
            }
            self.queue.pop();
            if let Some((from, to, m)) = self.pending.remove(&seq) {
                if self.cut.contains(&(from, to)) {
                    self.dropped += 1;
                } else {
                    out.push((from, to, m));
                }
            }
        }
        out
    }
}

pub(crate) struct Link {
    pub(crate) from: u64,
    pub(crate) net: Arc<Mutex<Net>>,
}

impl Transport for Link {
    fn send(&self, to: u64, messages: Vec<GroupMessage>) {
        self.net
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(self.from, to, messages);
    }
}
