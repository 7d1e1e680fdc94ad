//! The service behind the client port, one module per subsystem. Each
//! subsystem holds the handles it needs and is built before the node's
//! actors start (they reach actors through stable handles), in this order,
//! so no subsystem refers back to one built after it:
//!
//! - [`placement`]: where new blocks go, and their write grants;
//! - [`journal`]: the UFS journal of fs_mode mounts (on shard 0);
//! - [`replicas`]: block copies between nodes, re-replication;
//! - [`admin`]: shard moves, rebalance, decommission;
//! - [`fills`]: UFS objects into cached blocks, and uploads to the UFS;
//! - [`paths`]: requests on paths, under mounts too;
//! - [`persist`]: fs_mode persistence (journal replay, sweeps);
//! - [`loads`]: load jobs;
//! - [`loader`]: the `UfsLoader` actor that drives persistence and loads;
//! - [`scrub`]: verifying this node's blocks;
//! - [`files`]: `fs free` and `fs blocks`;
//! - [`reports`] (and [`metrics`]): reports, metrics, actor trees, traces
//!   of every node.
//!
//! [`Service`] answers client requests by handing each to its subsystem.

pub mod admin;
mod delegations;
pub mod extents;
pub mod files;
pub mod fills;
pub mod history;
pub mod journal;
pub mod loader;
pub mod loads;
pub mod metrics;
pub mod paths;
pub mod persist;
pub mod placement;
pub mod replicas;
pub mod reports;
pub mod scrub;

use std::path::PathBuf;
use std::sync::Arc;

use curvine_actors::blocks::{BlockManagerRef, BlockStore};
use curvine_actors::cluster::ClusterView;
use curvine_actors::membership::{announce, MembershipMsg};
use curvine_actors::mounts::{Mounts, NewMount};
use curvine_actors::namespace::Namespace;
use curvine_actors::supervisor::Slot;
use curvine_actors::token::TokenKey;
use curvine_actors::trace::RecorderRef;
use curvine_messages::block::DataNode;
use curvine_messages::mount::MountInfo;
use curvine_messages::rpc::{
    CompleteFile, Mount, OpenFile, RecordTrace, Request, Response, Umount, WriteOpen,
    MAX_RECORDED_EVENTS,
};
use curvine_messages::{Attr, FsError, FsResult};
use curvine_wire::cookie::ClientKey;
use curvine_wire::data::DataPool;

use admin::Admin;
use extents::{Extents, ExtentsArgs};
use files::Files;
use fills::{Fills, FillsArgs};
use journal::Journal;
use loads::Loads;
use paths::Paths;
use persist::Persistence;
use placement::Placement;
use replicas::Replicas;
pub use reports::NodeInfo;
use reports::Reports;
use scrub::Scrub;

/// What the subsystems are built from: the node's stores and the stable
/// handles of its actors (filled once the actors run).
pub struct Core {
    pub info: NodeInfo,
    pub namespace: Arc<Namespace>,
    pub view: Arc<ClusterView>,
    pub mounts: Arc<Mounts>,
    pub blocks: Arc<BlockStore>,
    pub manager: BlockManagerRef,
    pub membership: Slot<MembershipMsg>,
    pub recorder: RecorderRef,
    pub tokens: TokenKey,
    /// Checks that clients know the cluster cookie.
    pub clients: ClientKey,
    /// This node's data port, as clients reach it.
    pub data: DataNode,
    /// Connections to other nodes' data ports.
    pub pool: DataPool,
    /// The registered name of the root of the node's supervision tree.
    pub root: String,
    /// Copies of each block of an fs_mode file not yet persisted
    /// (`ufs.pending_replicas`).
    pub pending_replicas: u16,
    /// Copies of each shard's metadata (`meta.replicas`).
    pub meta_replicas: u32,
    /// How often the metrics history is sampled (`http.history_interval`).
    pub history_interval: std::time::Duration,
}

/// Every subsystem of the node, built in dependency order.
pub struct Subsystems {
    pub placement: Arc<Placement>,
    pub journal: Arc<Journal>,
    pub replicas: Arc<Replicas>,
    pub admin: Arc<Admin>,
    pub fills: Arc<Fills>,
    pub paths: Arc<Paths>,
    pub persist: Arc<Persistence>,
    pub loads: Arc<Loads>,
    pub scrub: Arc<Scrub>,
    pub files: Arc<Files>,
    pub extents: Arc<Extents>,
    pub reports: Arc<Reports>,
    pub history: Arc<history::History>,
}

impl Subsystems {
    pub fn build(core: &Core) -> Subsystems {
        let (ns, view, mounts) = (&core.namespace, &core.view, &core.mounts);
        let node_id = core.info.node_id.clone();
        let placement = Arc::new(Placement::new(
            view.clone(),
            core.tokens.clone(),
            core.data.clone(),
        ));
        let journal = Arc::new(Journal::new(ns.clone(), view.clone()));
        let replicas = Arc::new(Replicas::new(
            ns.clone(),
            view.clone(),
            core.blocks.clone(),
            core.manager.clone(),
            core.tokens.clone(),
            core.pool.clone(),
            core.pending_replicas,
        ));
        let admin = Arc::new(Admin::new(
            ns.clone(),
            view.clone(),
            replicas.clone(),
            core.membership.clone(),
            PathBuf::from(&core.info.data_dir),
            core.meta_replicas,
        ));
        let fills = Arc::new(Fills::new(FillsArgs {
            namespace: ns.clone(),
            mounts: mounts.clone(),
            blocks: core.blocks.clone(),
            manager: core.manager.clone(),
            tokens: core.tokens.clone(),
            pool: core.pool.clone(),
            placement: placement.clone(),
            replicas: replicas.clone(),
            node_id: node_id.clone(),
        }));
        let paths = Arc::new(Paths::new(
            ns.clone(),
            mounts.clone(),
            fills.clone(),
            journal.clone(),
            placement.clone(),
            core.tokens.clone(),
        ));
        let persist = Arc::new(Persistence::new(
            ns.clone(),
            view.clone(),
            mounts.clone(),
            fills.clone(),
            journal.clone(),
        ));
        let loads = Arc::new(Loads::new(
            ns.clone(),
            view.clone(),
            mounts.clone(),
            fills.clone(),
            journal.clone(),
            placement.clone(),
        ));
        let scrub = Arc::new(Scrub::new(
            ns.clone(),
            core.blocks.clone(),
            core.manager.clone(),
            node_id.clone(),
        ));
        let files = Arc::new(Files::new(
            ns.clone(),
            core.blocks.clone(),
            core.manager.clone(),
            node_id,
            view.metrics.clone(),
        ));
        let extents = Arc::new(Extents::new(ExtentsArgs {
            files: files.clone(),
            replicas: replicas.clone(),
            namespace: ns.clone(),
            view: view.clone(),
            blocks: core.blocks.clone(),
            manager: core.manager.clone(),
            tokens: core.tokens.clone(),
            pool: core.pool.clone(),
        }));
        let reports = Arc::new(Reports::new(reports::ReportsArgs {
            namespace: ns.clone(),
            view: view.clone(),
            blocks: core.blocks.clone(),
            info: core.info.clone(),
            recorder: core.recorder.clone(),
            scrub: scrub.clone(),
            loads: loads.clone(),
            persist: persist.clone(),
            root: core.root.clone(),
        }));
        Subsystems {
            placement,
            journal,
            replicas,
            admin,
            fills,
            paths,
            persist,
            loads,
            scrub,
            files,
            extents,
            reports,
            history: Arc::new(history::History::new(core.history_interval)),
        }
    }
}

/// Answers client requests: each goes to its subsystem.
pub struct Service {
    namespace: Arc<Namespace>,
    view: Arc<ClusterView>,
    mounts: Arc<Mounts>,
    membership: Slot<MembershipMsg>,
    info: NodeInfo,
    clients: ClientKey,
    placement: Arc<Placement>,
    replicas: Arc<Replicas>,
    admin: Arc<Admin>,
    paths: Arc<Paths>,
    persist: Arc<Persistence>,
    loads: Arc<Loads>,
    files: Arc<Files>,
    extents: Arc<Extents>,
    reports: Arc<Reports>,
    /// This node's block store, block manager and token key: a close
    /// commits the last block a writer wrote here short-circuit.
    local_blocks: (Arc<BlockStore>, BlockManagerRef, TokenKey),
}

impl Service {
    pub fn new(core: &Core, s: &Subsystems) -> Service {
        Service {
            namespace: core.namespace.clone(),
            view: core.view.clone(),
            mounts: core.mounts.clone(),
            membership: core.membership.clone(),
            info: core.info.clone(),
            clients: core.clients.clone(),
            placement: s.placement.clone(),
            replicas: s.replicas.clone(),
            admin: s.admin.clone(),
            paths: s.paths.clone(),
            persist: s.persist.clone(),
            loads: s.loads.clone(),
            files: s.files.clone(),
            extents: s.extents.clone(),
            reports: s.reports.clone(),
            local_blocks: (
                core.blocks.clone(),
                core.manager.clone(),
                core.tokens.clone(),
            ),
        }
    }

    pub fn cluster_id(&self) -> &str {
        &self.info.cluster_id
    }

    pub fn node_id(&self) -> &str {
        &self.info.node_id
    }

    /// Counts a client connection refused at `node.max_connections`.
    pub fn refused_connection(&self) {
        self.view.metrics.add(
            "curvine_client_connections_refused_total",
            "Client connections refused because the node served node.max_connections already.",
            &[],
            1,
        );
    }

    /// Checks that clients know the cluster cookie.
    pub fn clients(&self) -> &ClientKey {
        &self.clients
    }

    /// The node's tracer (requests of the client port start traces).
    pub fn tracer(&self) -> &curvine_actors::trace::Tracer {
        &self.view.tracer
    }

    /// The blocks this node's open readers hold.
    pub fn read_holds(&self) -> Arc<curvine_actors::blocks::ReadHolds> {
        self.local_blocks.0.holds.clone()
    }

    /// Handles a request of a client connection: an open for reading holds
    /// the blocks of the version it opened until the reader closes it or
    /// the connection (`holds`) ends.
    pub async fn handle_on(
        &self,
        request: Request,
        holds: &curvine_actors::blocks::ConnHolds,
    ) -> FsResult<Response> {
        match request {
            Request::OpenRead(r) => {
                let mut open = self.paths.open_read(&r.path).await?;
                open.hold = holds.hold(open.blocks.iter().map(|b| b.info.id).collect());
                Ok(Response::ReadOpen(open))
            }
            Request::CloseRead(r) => {
                for hold in r.holds {
                    holds.release(hold);
                }
                Ok(Response::Done(()))
            }
            other => self.handle(other).await,
        }
    }

    pub async fn handle(&self, request: Request) -> FsResult<Response> {
        let (ns, paths) = (&self.namespace, &self.paths);
        Ok(match request {
            Request::Stat(r) => Response::Attr(paths.stat(&r.path).await?),
            Request::Mkdir(r) => Response::Attr(paths.mkdir(&r).await?),
            Request::List(r) => Response::Listing(paths.list(&r.path, r.after, r.limit).await?),
            Request::Touch(r) => Response::Attr(paths.touch(&r).await?),
            Request::Symlink(r) => {
                Response::Attr(paths.symlink(&r.target, &r.link, r.uid, r.gid).await?)
            }
            Request::Mknod(r) => Response::Attr(paths.mknod(&r).await?),
            Request::Link(r) => Response::Attr(paths.link(&r.target, &r.link).await?),
            Request::Exchange(r) => Response::Done(paths.exchange(&r.a, &r.b).await?),
            Request::Readlink(r) => Response::Target(ns.readlink(&r.path).await?),
            Request::Rename(r) => Response::Done(paths.rename(&r.src, &r.dst).await?),
            Request::Remove(r) => {
                Response::Removed(paths.remove(&r.path, r.recursive, r.dir).await?)
            }
            Request::SetAttrs(r) => Response::Attr(paths.setattr(&r.path, r.set, r.follow).await?),
            Request::SetXattr(r) => Response::Done(
                paths
                    .through_ufs(&r.path, || {
                        ns.set_xattr(&r.path, &r.name, r.value.clone(), r.mode)
                    })
                    .await?,
            ),
            Request::GetXattr(r) => Response::Bytes(
                paths
                    .through_ufs(&r.path, || ns.get_xattr(&r.path, &r.name))
                    .await?,
            ),
            Request::ListXattr(r) => Response::Names(
                paths
                    .through_ufs(&r.path, || ns.list_xattr(&r.path))
                    .await?,
            ),
            Request::RemoveXattr(r) => Response::Done(
                paths
                    .through_ufs(&r.path, || ns.remove_xattr(&r.path, &r.name))
                    .await?,
            ),
            Request::Report(_) => Response::Report(self.reports.cluster_report().await?),
            Request::Fsck(_) => Response::Fsck(ns.fsck().await?),
            Request::OpenFile(r) => Response::WriteOpen(self.open_file(r).await?),
            Request::AddBlock(r) => {
                let id = ns.add_block(r.ino, r.handle, r.index).await?;
                Response::Grant(self.placement.grant(id, r.index, ns.default_block_size()))
            }
            Request::CompleteFile(r) => Response::Attr(self.complete_file(r).await?),
            Request::OpenRead(r) => Response::ReadOpen(paths.open_read(&r.path).await?),
            Request::FreePath(r) => Response::Freed(self.files.free_path(&r.path).await?),
            Request::Blocks(r) => Response::FileBlocks(self.files.file_blocks(&r.path).await?),
            Request::CloseRead(r) => {
                for hold in r.holds {
                    self.local_blocks.0.holds.release(hold);
                }
                Response::Done(())
            }
            Request::TouchBlocks(r) => {
                self.files.touch_blocks(&r.ids);
                Response::Done(())
            }
            Request::Assemble(r) => {
                Response::FileBlocks(self.extents.assemble(&r.path, false).await?)
            }
            Request::CopyHere(r) => {
                Response::FileBlocks(self.extents.assemble(&r.path, true).await?)
            }
            Request::Members(_) => Response::Members(self.view.members()),
            Request::MoveShard(r) => Response::Moved(self.admin.move_shard(r.shard, &r.to).await?),
            Request::Rebalance(_) => Response::Moves(self.admin.rebalance().await?),
            Request::Decommission(r) => {
                Response::Decommissioned(self.admin.decommission(&r.node).await?)
            }
            Request::Mount(r) => Response::Mounted(self.mount(r).await?.redacted()),
            Request::Umount(r) => Response::Mounted(self.umount(r).await?.redacted()),
            Request::Load(r) => {
                Response::Job(self.loads.start_load(&r.path, r.no_overwrite).await?)
            }
            Request::LoadStatus(r) => Response::Job(self.loads.load_job(&r.id).await?),
            Request::CancelLoad(r) => Response::Job(self.loads.cancel_load(&r.id).await?),
            Request::ListLoads(_) => Response::Jobs(self.loads.load_jobs().await?),
            Request::TraceEvents(r) => Response::Traces(self.reports.trace_events(r).await?),
            Request::Actors(r) => {
                Response::ActorTrees(self.reports.actors(r.node.as_deref()).await?)
            }
            Request::Scrub(r) => Response::Scrubbed(self.reports.scrub(r).await?),
            Request::RecordTrace(r) => Response::Done(self.record_trace(r)?),
            Request::ListMounts(_) => Response::MountList(self.list_mounts().await?),
            Request::Delegate(r) => Response::DirGrant(self.delegate(r).await?),
            Request::RenewDelegation(r) => {
                Response::Renewal(ns.renew_delegation(r.dir, r.holder).await?)
            }
            Request::AwaitRecall(r) => Response::Recall(ns.await_recall(r.dir, r.holder).await?),
            Request::DirOps(r) => Response::DirOps(self.dir_ops(r).await?),
            Request::ReleaseDelegation(r) => {
                Response::Done(ns.release_delegation(r.dir, r.holder).await?)
            }
        })
    }

    /// Opens a file for writing, with a grant for its first block.
    async fn open_file(&self, r: OpenFile) -> FsResult<WriteOpen> {
        let opened = self.paths.open_write(&r).await?;
        Ok(WriteOpen {
            first: opened
                .first
                .map(|(index, id)| self.placement.grant(id, index, opened.attr.block_size)),
            attr: opened.attr,
            handle: opened.handle,
            blocks: opened.blocks,
        })
    }

    /// Closes a written file; it returns once the replicas it needs exist
    /// (those it asks for, and `ufs.pending_replicas` while its content is
    /// only in the cluster, fewer when fewer nodes are up with room).
    async fn complete_file(&self, mut r: CompleteFile) -> FsResult<Attr> {
        let path = r.path.clone();
        if let Some(c) = r.commit.take() {
            // The last block, written short-circuit here: committed before
            // the file that lists it.
            let block = c.token.block;
            let (store, manager, tokens) = &self.local_blocks;
            let crc = manager.commit_local(store, tokens, c).await?;
            match r.blocks.iter_mut().find(|b| b.id == block) {
                Some(b) => b.crc = crc,
                None => {
                    return Err(FsError::InvalidArgument(format!(
                        "block {block:#x} committed with the close is not among its blocks"
                    )))
                }
            }
        }
        let attr = self.paths.complete(r).await?;
        if self.replicas.wanted(&attr) > 1 {
            if let Err(e) = self.replicas.replicate_file(attr.ino).await {
                if replicas::only_in_cluster(&attr) {
                    // Its only copy would be on one node: not acknowledged.
                    return Err(FsError::Unavailable(format!(
                        "{path} is written but not yet in the UFS, and copying it to another node failed ({e}); it is not acknowledged"
                    )));
                }
                // A failure leaves the file whole with fewer copies (topped up later).
                tracing::warn!(ino = attr.ino, error = %e, "replicating a written file failed");
            }
        }
        Ok(attr)
    }

    async fn mount(&self, r: Mount) -> FsResult<MountInfo> {
        if let Some(bs) = r.info.block_size {
            if bs == 0 || bs % (64 << 10) != 0 {
                return Err(FsError::InvalidArgument(format!(
                    "block size {bs}: expected a multiple of 64KiB"
                )));
            }
        }
        if r.info.replicas == Some(0) {
            return Err(FsError::InvalidArgument(
                "replicas must be at least 1".into(),
            ));
        }
        let m = self
            .mounts
            .mount(
                &self.namespace,
                NewMount {
                    info: r.info,
                    uid: r.uid,
                    gid: r.gid,
                },
            )
            .await?;
        announce(&self.membership);
        Ok(m)
    }

    async fn umount(&self, r: Umount) -> FsResult<MountInfo> {
        self.persist.check_umount(&r.path).await?;
        let m = self.mounts.umount(&self.namespace, &r.path).await?;
        announce(&self.membership);
        Ok(m)
    }

    async fn list_mounts(&self) -> FsResult<Vec<MountInfo>> {
        Ok(self
            .mounts
            .refresh(&self.namespace)
            .await?
            .mounts
            .iter()
            .map(|m| m.redacted())
            .collect())
    }

    /// Keeps trace events a client (a FUSE mount) recorded.
    fn record_trace(&self, r: RecordTrace) -> FsResult<()> {
        if r.events.len() > MAX_RECORDED_EVENTS {
            return Err(FsError::InvalidArgument(format!(
                "{} trace events in one request; at most {}",
                r.events.len(),
                MAX_RECORDED_EVENTS
            )));
        }
        self.view.tracer.record_all(r.events);
        Ok(())
    }
}
