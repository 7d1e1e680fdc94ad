//! What a node opens before its actors run: the metadata stores of its
//! shards (with the newest cluster map it can find) and its block store in
//! the storage tiers.

use std::sync::Arc;

use curvine_actors::blocks::{BlockStore, TierInfo};
use curvine_actors::engine::Engine;
use curvine_actors::membership::read_members_file;
use curvine_actors::store::{ShardIdentity, ShardStore, StoreOptions};
use curvine_conf::Config;
use curvine_messages::block::TierKind;
use curvine_messages::cluster::{ClusterMap, JoinInfo};
use curvine_messages::ShardId;

use super::error::StartError;
use crate::identity::DataDir;

/// The metadata engines of a node (one per environment), its shard stores
/// and the cluster map it starts with.
pub struct MetaStores {
    pub engines: Vec<Arc<Engine>>,
    pub stores: Vec<Arc<ShardStore>>,
    pub map: ClusterMap,
}

/// Opens every shard store (before any writer runs: LMDB does not allow
/// opening databases while other transactions of the process run). The
/// cluster map: the newest of shard 0's record (when this node holds shard
/// 0), the copy kept with the node table, and what the cluster told a new
/// node. The founder writes the first map.
pub async fn open_meta(
    config: &Config,
    data_dir: &DataDir,
    joined: Option<JoinInfo>,
) -> Result<MetaStores, StartError> {
    let identity = &data_dir.identity;
    let options = StoreOptions {
        map_size: config.meta.map_size.0,
        max_readers: config.meta.max_readers,
        sync_commit: config.meta.sync_commit,
        wal: config.meta.wal,
        wal_size: config.meta.wal_size.0,
        checkpoint_interval: config.meta.checkpoint_interval.0,
        replica_id: curvine_actors::replica::member_id(&data_dir.identity.node_id),
    };
    let identities: Vec<ShardIdentity> = (0..identity.shard_count as ShardId)
        .map(|shard| ShardIdentity {
            cluster_id: identity.cluster_id.clone(),
            shard,
            shard_count: identity.shard_count,
        })
        .collect();
    let paths: Vec<_> = identities
        .iter()
        .map(|i| data_dir.shard_env_path(i.shard))
        .collect();
    let (_, saved_map) = read_members_file(&data_dir.members_file());
    let founder_map = (identity.founder && saved_map.is_none())
        .then(|| ClusterMap::single(&identity.node_id, identity.shard_count));
    let (engines, stores, stored_map) = tokio::task::spawn_blocking(move || {
        // Shards of the `meta` layout share one environment.
        let mut engines: Vec<Arc<Engine>> = Vec::new();
        let mut stores = Vec::with_capacity(identities.len());
        for (id, path) in identities.iter().zip(paths) {
            let engine = match engines.iter().find(|e| e.path() == path) {
                Some(engine) => engine.clone(),
                None => {
                    let engine = Engine::open(&path, &options)?;
                    engines.push(engine.clone());
                    engine
                }
            };
            stores.push(Arc::new(ShardStore::open(&engine, id)?));
        }
        let stored = stores[0].init_cluster_map(founder_map.as_ref())?;
        Ok::<_, curvine_messages::FsError>((engines, stores, stored))
    })
    .await
    .map_err(|e| StartError::Actors(e.to_string()))?
    .map_err(|e| StartError::Store(e.to_string()))?;
    let map = [stored_map, saved_map, joined.map(|j| j.map)]
        .into_iter()
        .flatten()
        .filter(|m| m.shards.len() == identity.shard_count as usize)
        .max_by_key(|m| m.version)
        .unwrap_or_else(|| ClusterMap {
            version: 0,
            shards: vec![String::new(); identity.shard_count as usize],
            followers: Vec::new(),
        });
    Ok(MetaStores {
        engines,
        stores,
        map,
    })
}

/// Opens the block store in the node's tiers: index and files agree after
/// any crash (see `BlockStore::open`).
pub async fn open_blocks(
    config: &Config,
    data_dir: &DataDir,
) -> Result<Arc<BlockStore>, StartError> {
    let tiers = node_tiers(config, &data_dir.path, &data_dir.identity.node_id);
    for t in &tiers {
        tracing::info!(tier = %t.kind, path = %t.root.display(), capacity = %curvine_actors::blocks::human(t.capacity), "storage tier");
    }
    let index_dir = data_dir.path.join("blocks");
    let sync_blocks = config.data.sync_blocks;
    let (block_store, reconciled) =
        tokio::task::spawn_blocking(move || BlockStore::open(&index_dir, tiers, sync_blocks))
            .await
            .map_err(|e| StartError::Actors(e.to_string()))?
            .map_err(|e| StartError::Store(e.to_string()))?;
    tracing::info!(
        blocks = reconciled.blocks,
        missing = reconciled.missing,
        finished = reconciled.finished,
        temporary = reconciled.temporary,
        unindexed = reconciled.unindexed,
        "block store opened"
    );
    Ok(Arc::new(block_store))
}

/// The configured tiers, or the default: a MEM tier in /dev/shm sized to a
/// quarter of memory (at most half of /dev/shm); an HDD tier in the data
/// directory where there is no /dev/shm.
pub fn node_tiers(config: &Config, data_dir: &std::path::Path, node_id: &str) -> Vec<TierInfo> {
    let configured = config.tiers();
    if !configured.is_empty() {
        return configured
            .into_iter()
            .map(|t| TierInfo {
                kind: TierKind::parse(&t.kind).unwrap_or(TierKind::Hdd),
                root: t.path,
                capacity: t.capacity,
            })
            .collect();
    }
    let shm = std::path::Path::new("/dev/shm");
    match fs_size(shm) {
        Some((total, _)) => {
            // SAFETY: sysconf has no preconditions.
            let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) }.max(0) as u64;
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
            let memory = pages * page;
            let capacity = (memory / 4).min(total / 2).max(64 << 20);
            vec![TierInfo {
                kind: TierKind::Mem,
                root: shm.join("curvine").join(node_id),
                capacity,
            }]
        }
        None => {
            let root = data_dir.join("tier-hdd");
            let free = fs_size(data_dir).map(|(_, free)| free).unwrap_or(1 << 30);
            vec![TierInfo {
                kind: TierKind::Hdd,
                root,
                capacity: (free / 2).max(64 << 20),
            }]
        }
    }
}

/// Total and free bytes of the file system holding `path`.
pub fn fs_size(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a valid out pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some((st.f_blocks as u64 * frsize, st.f_bavail as u64 * frsize))
}
