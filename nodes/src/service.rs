//! Answers client requests with the node's actors.

use std::sync::Arc;

use curvine_actors::namespace::Namespace;
use curvine_messages::rpc::{ClusterReport, NodeReport, Request, Response};
use curvine_messages::FsResult;

/// What the node tells about itself in reports.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub cluster_id: String,
    pub node_id: String,
    pub rpc_addr: String,
    pub cluster_addr: String,
    pub data_dir: String,
    pub started_ns: i64,
}

pub struct Service {
    pub namespace: Arc<Namespace>,
    pub info: NodeInfo,
}

impl Service {
    pub fn cluster_id(&self) -> &str {
        &self.info.cluster_id
    }

    pub fn node_id(&self) -> &str {
        &self.info.node_id
    }

    pub async fn handle(&self, request: Request) -> FsResult<Response> {
        let ns = &self.namespace;
        Ok(match request {
            Request::Stat(r) => Response::Attr(ns.stat(&r.path, false).await?),
            Request::Mkdir(r) => {
                Response::Attr(ns.mkdir(&r.path, r.parents, r.mode, r.uid, r.gid).await?)
            }
            Request::List(r) => Response::Listing(ns.list(&r.path, r.after, r.limit).await?),
            Request::Touch(r) => {
                Response::Attr(ns.touch(&r.path, r.mode, r.exclusive, r.uid, r.gid).await?)
            }
            Request::Symlink(r) => {
                Response::Attr(ns.symlink(&r.target, &r.link, r.uid, r.gid).await?)
            }
            Request::Readlink(r) => Response::Target(ns.readlink(&r.path).await?),
            Request::Rename(r) => Response::Done(ns.rename(&r.src, &r.dst).await?),
            Request::Remove(r) => Response::Removed(ns.remove(&r.path, r.recursive, r.dir).await?),
            Request::SetAttrs(r) => Response::Attr(ns.setattr(&r.path, r.set).await?),
            Request::SetXattr(r) => {
                Response::Done(ns.set_xattr(&r.path, &r.name, r.value, r.mode).await?)
            }
            Request::GetXattr(r) => Response::Bytes(ns.get_xattr(&r.path, &r.name).await?),
            Request::ListXattr(r) => Response::Names(ns.list_xattr(&r.path).await?),
            Request::RemoveXattr(r) => Response::Done(ns.remove_xattr(&r.path, &r.name).await?),
            Request::Report(_) => Response::Report(ClusterReport {
                cluster_id: self.info.cluster_id.clone(),
                shard_count: ns.shard_count(),
                nodes: vec![NodeReport {
                    node_id: self.info.node_id.clone(),
                    rpc_addr: self.info.rpc_addr.clone(),
                    cluster_addr: self.info.cluster_addr.clone(),
                    started_ns: self.info.started_ns,
                    data_dir: self.info.data_dir.clone(),
                    shards: ns.shard_stats().await?,
                }],
            }),
            Request::Fsck(_) => Response::Fsck(ns.fsck().await?),
        })
    }
}
