//! A linearizability checker for histories of namespace operations (the
//! Wing-Gong search with Lowe's memoization, as Knossos and Porcupine run
//! it): is there one order of the operations, each taking effect at an
//! instant between its call and its return, in which the sequential
//! [`Model`] gives every operation the result the cluster gave it?
//!
//! An operation whose outcome is unknown (the call failed in a way that
//! says nothing about whether it was applied) may take effect at any
//! instant after its call, or never.

use std::collections::HashSet;
use std::time::Instant;

use crate::model::{Model, Op};

/// What a call returned: the model's error kind names, or unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done(Result<(), String>),
    Unknown,
}

/// One call of a history.
#[derive(Debug, Clone)]
pub struct Call {
    pub client: usize,
    pub op: Op,
    pub outcome: Outcome,
    pub called: Instant,
    /// When it returned; `None` for an unknown outcome (as if it never did).
    pub returned: Option<Instant>,
}

/// Why a history is not linearizable: the longest prefix of calls the
/// search could order, and the calls none of whose orders fitted next.
#[derive(Debug)]
pub struct Violation {
    pub ordered: Vec<Call>,
    pub stuck: Vec<Call>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "no linearization; the longest order found ({} calls) ends with:",
            self.ordered.len()
        )?;
        let skip = self.ordered.len().saturating_sub(12);
        for c in &self.ordered[skip..] {
            writeln!(f, "  client {} {:?} -> {:?}", c.client, c.op, c.outcome)?;
        }
        writeln!(f, "and none of these fits next:")?;
        for c in &self.stuck {
            writeln!(f, "  client {} {:?} -> {:?}", c.client, c.op, c.outcome)?;
        }
        Ok(())
    }
}

/// The model's entries, as a memo key.
type StateKey = Vec<(String, u8)>;

struct Search<'a> {
    calls: &'a [Call],
    /// Calls taken, as a bit set.
    taken: Vec<u64>,
    /// (taken set, model state) pairs already explored without success.
    seen: HashSet<(Vec<u64>, StateKey)>,
    path: Vec<usize>,
    best: Vec<usize>,
}

fn state_key(model: &Model) -> StateKey {
    model
        .entries
        .iter()
        .map(|(k, v)| (k.clone(), v.letter() as u8))
        .collect()
}

impl Search<'_> {
    fn is_taken(&self, i: usize) -> bool {
        self.taken[i / 64] & (1 << (i % 64)) != 0
    }

    fn flip(&mut self, i: usize) {
        self.taken[i / 64] ^= 1 << (i % 64);
    }

    /// Whether every call with a known outcome is taken.
    fn complete(&self) -> bool {
        (0..self.calls.len()).all(|i| self.is_taken(i) || self.calls[i].outcome == Outcome::Unknown)
    }

    /// Calls that may take effect next: not taken, and called before every
    /// call not taken has returned.
    fn candidates(&self) -> Vec<usize> {
        let horizon = (0..self.calls.len())
            .filter(|&i| !self.is_taken(i))
            .filter_map(|i| self.calls[i].returned)
            .min();
        (0..self.calls.len())
            .filter(|&i| !self.is_taken(i))
            .filter(|&i| horizon.is_none_or(|h| self.calls[i].called < h))
            .collect()
    }

    fn run(&mut self, model: &Model) -> bool {
        if self.complete() {
            return true;
        }
        if !self.seen.insert((self.taken.clone(), state_key(model))) {
            return false;
        }
        for i in self.candidates() {
            let mut next = model.clone();
            let result = next.apply(&self.calls[i].op).map_err(str::to_string);
            let fits = match &self.calls[i].outcome {
                Outcome::Unknown => true,
                Outcome::Done(r) => *r == result,
            };
            if !fits {
                continue;
            }
            self.flip(i);
            self.path.push(i);
            if self.path.len() > self.best.len() {
                self.best = self.path.clone();
            }
            if self.run(&next) {
                return true;
            }
            self.path.pop();
            self.flip(i);
        }
        false
    }
}

/// Checks `calls` (in any order) against the model rooted at `root`, empty
/// at the start. The search recurses once per call ordered, so it runs on
/// a thread with a stack for that (reserved, not touched, until used).
pub fn check(root: &str, calls: &[Call]) -> Result<(), Violation> {
    let (root, calls) = (root.to_string(), calls.to_vec());
    let frames = 4096 * (calls.len() + 64);
    std::thread::Builder::new()
        .stack_size(frames.max(8 << 20))
        .spawn(move || search(&root, calls))
        .expect("a thread for the search")
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

fn search(root: &str, calls: Vec<Call>) -> Result<(), Violation> {
    let mut calls = calls;
    calls.sort_by_key(|c| c.called);
    let mut search = Search {
        calls: &calls,
        taken: vec![0; calls.len().div_ceil(64)],
        seen: HashSet::new(),
        path: Vec::new(),
        best: Vec::new(),
    };
    if search.run(&Model::new(root)) {
        return Ok(());
    }
    let best = search.best.clone();
    let mut taken = vec![false; calls.len()];
    for &i in &best {
        taken[i] = true;
    }
    let horizon = (0..calls.len())
        .filter(|&i| !taken[i])
        .filter_map(|i| calls[i].returned)
        .min();
    Err(Violation {
        ordered: best.iter().map(|&i| calls[i].clone()).collect(),
        stuck: (0..calls.len())
            .filter(|&i| !taken[i] && horizon.is_none_or(|h| calls[i].called < h))
            .map(|i| calls[i].clone())
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn call(client: usize, op: Op, r: Result<(), &str>, from: u64, to: u64) -> Call {
        let t0 = *START;
        Call {
            client,
            op,
            outcome: Outcome::Done(r.map_err(str::to_string)),
            called: t0 + Duration::from_millis(from),
            returned: Some(t0 + Duration::from_millis(to)),
        }
    }

    static START: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

    fn a() -> String {
        "/r/a".into()
    }

    #[test]
    fn concurrent_creates_of_one_name_have_one_winner() {
        let h = vec![
            call(0, Op::Create(a()), Ok(()), 0, 10),
            call(1, Op::Create(a()), Err("already_exists"), 1, 9),
        ];
        assert!(check("/r", &h).is_ok());
        // Both winning is not linearizable, overlapping or not.
        let h = vec![
            call(0, Op::Create(a()), Ok(()), 0, 10),
            call(1, Op::Create(a()), Ok(()), 1, 9),
        ];
        assert!(check("/r", &h).is_err());
    }

    #[test]
    fn a_stale_read_after_a_returned_change_is_caught() {
        // Client 0 unlinks a and returns; client 1, called after that,
        // still finds a (its create says it exists): a stale answer.
        let h = vec![
            call(0, Op::Create(a()), Ok(()), 0, 5),
            call(0, Op::Unlink(a()), Ok(()), 6, 10),
            call(1, Op::Create(a()), Err("already_exists"), 11, 15),
        ];
        let e = check("/r", &h).unwrap_err();
        assert!(e.to_string().contains("already_exists"), "{e}");
        // Overlapping the unlink, the same answer is fine.
        let h = vec![
            call(0, Op::Create(a()), Ok(()), 0, 5),
            call(0, Op::Unlink(a()), Ok(()), 6, 10),
            call(1, Op::Create(a()), Err("already_exists"), 7, 15),
        ];
        assert!(check("/r", &h).is_ok());
    }

    #[test]
    fn an_unknown_outcome_may_or_may_not_have_happened() {
        let mut lost = call(0, Op::Create(a()), Ok(()), 0, 5);
        lost.outcome = Outcome::Unknown;
        lost.returned = None;
        let applied = vec![lost.clone(), call(1, Op::Unlink(a()), Ok(()), 20, 25)];
        assert!(check("/r", &applied).is_ok());
        let not_applied = vec![lost, call(1, Op::Unlink(a()), Err("not_found"), 20, 25)];
        assert!(check("/r", &not_applied).is_ok());
    }

    #[test]
    fn a_change_applied_twice_is_caught() {
        // A create retried after its first attempt was applied must not
        // answer "already exists" to the only client that created it.
        let h = vec![
            call(0, Op::Mkdir("/r/d".into()), Ok(()), 0, 5),
            call(0, Op::Create("/r/d/x".into()), Err("already_exists"), 6, 10),
        ];
        assert!(check("/r", &h).is_err());
    }
}
