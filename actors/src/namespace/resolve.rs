//! Path resolution: one lookup per component, each in the shard that holds
//! the directory, following symlinks.

use curvine_messages::path::{components, join};
use curvine_messages::shard::ShardMsg;
use curvine_messages::{shard_of, Attr, DirEntry, FileKind, FsError, FsResult, Ino, ROOT_INO};

use super::{Follow, Namespace, MAX_SYMLINK_HOPS};

impl Namespace {
    // ---- single lookups ----------------------------------------------------

    pub async fn lookup(&self, parent: Ino, name: &str) -> FsResult<DirEntry> {
        let name = name.to_string();
        self.call(shard_of(parent), move |reply| ShardMsg::Lookup {
            parent,
            name: name.clone(),
            reply,
        })
        .await
    }

    pub async fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        self.call(shard_of(ino), move |reply| ShardMsg::GetAttr { ino, reply })
            .await
    }

    pub async fn readdir(
        &self,
        ino: Ino,
        after: Option<String>,
        limit: u32,
    ) -> FsResult<Vec<DirEntry>> {
        self.call(shard_of(ino), move |reply| ShardMsg::ReadDir {
            ino,
            after: after.clone(),
            limit,
            reply,
        })
        .await
    }

    // ---- path resolution ---------------------------------------------------

    /// Resolves normalised path components to the inode they name.
    pub(super) async fn resolve_parts(&self, parts: &[String], follow: Follow) -> FsResult<Attr> {
        let mut pending: Vec<String> = parts.iter().rev().cloned().collect();
        let mut done: Vec<String> = Vec::new();
        let mut current: Ino = ROOT_INO;
        let mut current_kind = FileKind::Dir;
        let mut hops = 0;
        // Attributes of `current` when the last lookup brought them along.
        let mut current_attr: Option<Attr> = None;
        while let Some(name) = pending.pop() {
            if current_kind != FileKind::Dir {
                return Err(FsError::NotADirectory(join(&done)));
            }
            let last = pending.is_empty();
            let (entry, attr) = if last {
                // The final inode is usually in its directory's shard: one hop.
                let name = name.clone();
                self.call(shard_of(current), move |reply| ShardMsg::LookupAttr {
                    parent: current,
                    name: name.clone(),
                    reply,
                })
                .await?
            } else {
                (self.lookup(current, &name).await?, None)
            };
            if entry.kind == FileKind::Symlink && (!last || follow == Follow::All) {
                hops += 1;
                if hops > MAX_SYMLINK_HOPS {
                    return Err(FsError::TooManyLinks(join(parts)));
                }
                let link = match attr {
                    Some(attr) => attr,
                    None => self.getattr(entry.ino).await?,
                };
                let target = link.symlink.unwrap_or_default();
                let base = if target.starts_with('/') {
                    "/".to_string()
                } else {
                    join(&done)
                };
                let target_parts = components(&target, &base)?;
                for part in target_parts.into_iter().rev() {
                    pending.push(part);
                }
                // The target's components are absolute: continue from the root.
                done.clear();
                current = ROOT_INO;
                current_kind = FileKind::Dir;
                current_attr = None;
                continue;
            }
            done.push(name);
            current = entry.ino;
            current_kind = entry.kind;
            current_attr = attr;
        }
        match current_attr {
            Some(attr) => Ok(attr),
            None => self.getattr(current).await,
        }
    }

    pub async fn resolve(&self, path: &str) -> FsResult<Attr> {
        self.resolve_parts(&components(path, "/")?, Follow::All)
            .await
    }

    /// Resolves the parent directory of a path; returns it with the last name.
    pub(super) async fn resolve_parent(&self, path: &str) -> FsResult<(Attr, String)> {
        let parts = components(path, "/")?;
        let Some((name, parent)) = parts.split_last() else {
            return Err(FsError::InvalidArgument(
                "the root directory has no parent".into(),
            ));
        };
        let parent = self.resolve_parts(parent, Follow::All).await?;
        if parent.kind != FileKind::Dir {
            return Err(FsError::NotADirectory(String::new()));
        }
        Ok((parent, name.clone()))
    }

    /// `stat`: follows a symlink at the end when `follow` is set.
    pub async fn stat(&self, path: &str, follow: bool) -> FsResult<Attr> {
        let follow = if follow {
            Follow::All
        } else {
            Follow::Intermediate
        };
        self.resolve_parts(&components(path, "/")?, follow).await
    }
}
