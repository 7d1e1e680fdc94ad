//! A member: its directory, its clock, and its process while it runs (a
//! real engine whose write side the simulator steps); crashes of the
//! process and of the machine.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

use curvine_actors::clock::Clock;
use curvine_actors::engine::Engine;
use curvine_actors::replica::{read_group_state, write_group_state, Transport};
use curvine_actors::store::{ShardIdentity, ShardStore, StoreOptions};
use curvine_actors::writer::{Inbox, StepOptions, Stepper, Writer};
use curvine_messages::wal::GroupState;

use crate::net::{Link, Net};
use crate::SHARD;

/// A member's process while it runs.
pub(crate) struct Live {
    pub(crate) store: Arc<ShardStore>,
    pub(crate) writer: Writer,
    pub(crate) stepper: Stepper,
    pub(crate) inbox: Inbox,
}

pub(crate) struct Member {
    pub(crate) id: u64,
    pub(crate) dir: PathBuf,
    pub(crate) clock: Clock,
    /// How far its clock runs ahead of simulated time (clock jumps).
    pub(crate) ahead: Duration,
    pub(crate) election_tick: usize,
    /// Entries its log keeps below what it applied (small: members catch
    /// up by snapshot within a run).
    pub(crate) log_window: u64,
    pub(crate) live: Option<Live>,
    /// Not stepped before this time (a paused process).
    pub(crate) paused_until: Duration,
    /// Down until this time, then started again.
    pub(crate) down_until: Option<Duration>,
    /// LMDB's data file as its last checkpoint left it on disk, for a
    /// machine crash, and the log's epoch then (every open ends with a
    /// checkpoint; later ones raise the epoch).
    pub(crate) synced: Option<(u64, Vec<u8>)>,
}

fn options(id: u64) -> StoreOptions {
    StoreOptions {
        map_size: 64 << 20,
        max_readers: 16,
        sync_commit: true,
        wal: true,
        wal_size: 1 << 20,
        checkpoint_interval: Duration::from_millis(200),
        replica_id: id,
    }
}

fn identity() -> ShardIdentity {
    ShardIdentity {
        cluster_id: "sim".into(),
        shard: SHARD,
        shard_count: 4,
    }
}

impl Member {
    pub(crate) fn now(&self, t: Duration) -> Duration {
        t + self.ahead
    }

    pub(crate) fn open(&mut self, ids: &[u64], net: &Arc<Mutex<Net>>) -> Result<(), String> {
        let engine = Engine::open_with_clock(&self.dir, &options(self.id), self.clock.clone())
            .map_err(|e| format!("member {} does not open: {e}", self.id))?;
        let store = Arc::new(
            ShardStore::open(&engine, &identity())
                .map_err(|e| format!("member {}'s shard does not open: {e}", self.id))?,
        );
        drop(engine);
        let founded = {
            let txn = store.read_txn().map_err(|e| e.to_string())?;
            read_group_state(store.tables()[0], &txn, SHARD)
                .map_err(|e| e.to_string())?
                .is_some()
        };
        if !founded {
            // The founding members, durable before the group runs.
            let mut txn = store.env().write_txn().map_err(|e| e.to_string())?;
            let members = GroupState {
                voters: ids.to_vec(),
                ..GroupState::default()
            };
            write_group_state(store.tables()[0], &mut txn, SHARD, &members)
                .map_err(|e| e.to_string())?;
            txn.commit().map_err(|e| e.to_string())?;
            store.checkpoint().map_err(|e| e.to_string())?;
        }
        let link: Arc<dyn Transport> = Arc::new(Link {
            from: self.id,
            net: net.clone(),
        });
        let options = StepOptions {
            election_tick: Some(self.election_tick),
            log_window: Some(self.log_window),
            ..StepOptions::default()
        };
        let (writer, stepper) =
            Writer::stepped(&store, Some(link), &options).map_err(|e| e.to_string())?;
        let inbox = writer.inbox();
        self.live = Some(Live {
            store,
            writer,
            stepper,
            inbox,
        });
        self.note_checkpoint();
        Ok(())
    }

    /// Keeps a copy of LMDB's data file when the log took a checkpoint
    /// since the last copy: what a machine crash leaves of it.
    pub(crate) fn note_checkpoint(&mut self) {
        let Some(live) = &self.live else { return };
        let Some(wal) = live.store.engine().wal() else {
            return;
        };
        let epoch = wal.lock().unwrap_or_else(|p| p.into_inner()).epoch();
        if self.synced.as_ref().is_some_and(|(e, _)| *e == epoch) {
            return;
        }
        // The pages LMDB uses (the file's tail is zeros kept ahead).
        let env = live.store.env();
        let page = env.unnamed_database_stat().page_size as usize;
        let used = (env.info().last_page_number + 1) * page;
        let mut data = vec![0u8; used];
        let read = std::fs::File::open(self.dir.join("data.mdb"))
            .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut data, 0));
        if read.is_ok() {
            self.synced = Some((epoch, data));
        }
    }

    /// Stops the process without a clean stop; with `machine`, the pages
    /// LMDB wrote since the last checkpoint each reach the disk or not.
    pub(crate) fn crash(&mut self, machine: bool, rng: &mut StdRng) -> Result<(), String> {
        let Some(live) = self.live.take() else {
            return Ok(());
        };
        let closing = live.store.engine().closing();
        drop(live);
        if !closing.wait_timeout(Duration::from_secs(10)) {
            return Err(format!(
                "member {}'s environment is still open after its process crashed",
                self.id
            ));
        }
        if machine {
            if let Some((_, base)) = &self.synced {
                lose_unsynced_pages(&self.dir.join("data.mdb"), base, rng);
            }
        }
        Ok(())
    }
}

/// A machine crash as the disk may have it: each page written since the
/// checkpoint either reached the disk or did not.
fn lose_unsynced_pages(data: &Path, base: &[u8], rng: &mut StdRng) {
    let Ok(now) = std::fs::read(data) else {
        return;
    };
    const PAGE: usize = 4096;
    let mut torn = now.clone();
    for (i, page) in torn.chunks_mut(PAGE).enumerate() {
        let at = i * PAGE;
        let old = base.get(at..at + page.len());
        if old == Some(&*page) || !rng.gen_bool(0.5) {
            continue;
        }
        match old {
            Some(old) => page.copy_from_slice(old),
            None => page.fill(0),
        }
    }
    let _ = std::fs::write(data, torn);
}
