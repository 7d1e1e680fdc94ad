//! The inodes the kernel knows: FUSE inode numbers, the names they were
//! found under (the cluster's API takes paths), lookup counts, and the
//! client metadata cache (attributes and names with the time they were
//! fetched).
//!
//! Invariants:
//! - FUSE inode 1 is the mount's root (`fuse.fs_path`); every other FUSE
//!   inode number is the cluster's inode number, so a name that moves keeps
//!   its inode.
//! - Each known inode but the root has one (parent, name) its path is
//!   built from, and a file with hard links also the other names the
//!   mount knows (`others`): when the name in use is removed or moved
//!   away, another takes its place. A path is rebuilt by walking parents
//!   (directories have one name), so a directory rename updates one
//!   entry, not its subtree.
//! - An inode stays while the kernel holds lookups of it (and while
//!   children refer to it); `forget` brings the count to zero and drops it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use curvine_messages::{Attr, FileKind, FsError, FsResult};

/// FUSE's inode number of the mount's root.
pub const ROOT: u64 = 1;

/// Attributes of nothing (a negative entry's).
pub(crate) fn empty_attr() -> Attr {
    Attr {
        ino: 0,
        kind: FileKind::File,
        mode: 0,
        uid: 0,
        gid: 0,
        size: 0,
        atime_ns: 0,
        mtime_ns: 0,
        ctime_ns: 0,
        nlink: 0,
        symlink: None,
        block_size: 0,
        replicas: 0,
        parent: 0,
        storage: None,
        writing: None,
        ufs: None,
    }
}

struct Node {
    parent: u64,
    name: String,
    /// Other names of a file with hard links, as (parent, name).
    others: Vec<(u64, String)>,
    lookups: u64,
    /// Open handles and writer tasks that still need the inode's path
    /// after the kernel forgot it.
    pins: u32,
    attr: Attr,
    fetched: Instant,
    /// Unlinked while open here: renamed to a hidden name until the last
    /// handle closes.
    hidden: bool,
    /// (size, mtime, ctime) of the content the kernel's page cache holds,
    /// set at each open: an open that finds the same keeps the page cache.
    cached: Option<ContentVersion>,
}

/// Names in a mount that hold files unlinked while open.
pub const HIDDEN_PREFIX: &str = ".curvine-hidden.";

/// Caches attributes unless they are older than those cached: a reply
/// fetched before a change may arrive after it (every change moves ctime).
fn store(node: &mut Node, attr: Attr, now: Instant) {
    if attr.ctime_ns >= node.attr.ctime_ns || attr.ino != node.attr.ino {
        node.attr = attr;
        node.fetched = now;
    }
}

pub struct Inodes {
    root_path: String,
    root_cluster: RwLock<u64>,
    nodes: RwLock<HashMap<u64, Node>>,
    /// (parent, name) -> (inode, when seen): the name cache.
    names: RwLock<HashMap<(u64, String), (u64, Instant)>>,
    ttl: Duration,
}

impl Inodes {
    pub fn new(root_path: &str, root: Attr, ttl: Duration) -> Inodes {
        let root_cluster = root.ino;
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                parent: ROOT,
                name: String::new(),
                others: Vec::new(),
                lookups: 1,
                pins: 0,
                attr: root,
                fetched: Instant::now(),
                hidden: false,
                cached: None,
            },
        );
        Inodes {
            root_path: root_path.trim_end_matches('/').to_string(),
            root_cluster: RwLock::new(root_cluster),
            nodes: RwLock::new(nodes),
            names: RwLock::new(HashMap::new()),
            ttl,
        }
    }

    /// The FUSE inode number of a cluster inode.
    pub fn fuse_ino(&self, cluster: u64) -> u64 {
        if cluster == *self.root_cluster.read() {
            ROOT
        } else {
            cluster
        }
    }

    /// The cluster inode number of a FUSE inode.
    pub fn cluster_ino(&self, ino: u64) -> u64 {
        if ino == ROOT {
            *self.root_cluster.read()
        } else {
            ino
        }
    }

    /// The namespace path of a known inode.
    pub fn path(&self, ino: u64) -> FsResult<String> {
        let nodes = self.nodes.read();
        let mut parts = Vec::new();
        let mut at = ino;
        while at != ROOT {
            let node = nodes.get(&at).ok_or_else(|| {
                FsError::Stale(format!("inode {ino:#x} is no longer known to the mount"))
            })?;
            parts.push(node.name.as_str());
            at = node.parent;
            if parts.len() > curvine_messages::MAX_PATH_LEN / 2 {
                return Err(FsError::Io(format!("inode {ino:#x}: parent loop")));
            }
        }
        let mut path = self.root_path.clone();
        for part in parts.iter().rev() {
            path.push('/');
            path.push_str(part);
        }
        if path.is_empty() {
            path.push('/');
        }
        Ok(path)
    }

    /// The path of `name` in directory `parent`.
    pub fn child_path(&self, parent: u64, name: &str) -> FsResult<String> {
        Ok(curvine_messages::path::child(&self.path(parent)?, name))
    }

    /// Records that the kernel looked `attr` up as `name` in `parent`
    /// (one more lookup), and caches its attributes. Returns the FUSE inode.
    pub fn remember(&self, parent: u64, name: &str, attr: Attr) -> u64 {
        let ino = self.fuse_ino(attr.ino);
        let now = Instant::now();
        {
            let mut nodes = self.nodes.write();
            match nodes.get_mut(&ino) {
                Some(node) => {
                    node.lookups += 1;
                    if ino != ROOT {
                        let old = (node.parent, std::mem::take(&mut node.name));
                        node.others.retain(|(p, n)| !(*p == parent && n == name));
                        let linked = attr.kind != FileKind::Dir && attr.nlink > 1;
                        if !linked {
                            node.others.clear();
                        } else if old != (parent, name.to_string()) {
                            node.others.push(old);
                        }
                        node.parent = parent;
                        node.name = name.to_string();
                    }
                    store(node, attr, now);
                }
                None => {
                    nodes.insert(
                        ino,
                        Node {
                            parent,
                            name: name.to_string(),
                            others: Vec::new(),
                            lookups: 1,
                            pins: 0,
                            attr,
                            fetched: now,
                            hidden: false,
                            cached: None,
                        },
                    );
                }
            }
        }
        self.names
            .write()
            .insert((parent, name.to_string()), (ino, now));
        ino
    }

    /// The kernel dropped `n` lookups of `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        let mut nodes = self.nodes.write();
        let Some(node) = nodes.get_mut(&ino) else {
            return;
        };
        node.lookups = node.lookups.saturating_sub(n);
        self.drop_unused(&mut nodes, ino);
    }

    fn drop_unused(&self, nodes: &mut HashMap<u64, Node>, ino: u64) {
        let Some(node) = nodes.get(&ino) else {
            return;
        };
        if node.lookups > 0 || node.pins > 0 || ino == ROOT {
            return;
        }
        let mut keys = node.others.clone();
        keys.push((node.parent, node.name.clone()));
        nodes.remove(&ino);
        let mut names = self.names.write();
        for key in keys {
            if names.get(&key).is_some_and(|(i, _)| *i == ino) {
                names.remove(&key);
            }
        }
    }

    /// Keeps an inode (and its path) while a handle or writer needs it.
    pub fn pin(&self, ino: u64) {
        if let Some(node) = self.nodes.write().get_mut(&ino) {
            node.pins += 1;
        }
    }

    pub fn unpin(&self, ino: u64) {
        let mut nodes = self.nodes.write();
        if let Some(node) = nodes.get_mut(&ino) {
            node.pins = node.pins.saturating_sub(1);
        }
        self.drop_unused(&mut nodes, ino);
    }

    /// Cached attributes of an inode, if fetched within the TTL.
    pub fn fresh_attr(&self, ino: u64) -> Option<Attr> {
        let nodes = self.nodes.read();
        let node = nodes.get(&ino)?;
        (node.fetched.elapsed() < self.ttl).then(|| node.attr.clone())
    }

    /// The last attributes fetched of an inode, however old.
    pub fn attr(&self, ino: u64) -> Option<Attr> {
        self.nodes.read().get(&ino).map(|n| n.attr.clone())
    }

    /// Stores attributes just fetched or returned by a change.
    pub fn set_attr(&self, ino: u64, attr: Attr) {
        if let Some(node) = self.nodes.write().get_mut(&ino) {
            store(node, attr, Instant::now());
        }
    }

    /// A file was just made in directory `ino` by this mount, at
    /// `changed_ns` (the new file's ctime, which the cluster gave the
    /// directory's mtime and ctime in the same change): cached attributes
    /// of the directory take those times and stay fresh, so the next
    /// create in it (the kernel checks the directory's permissions before
    /// each) needs no request. Attributes already expired stay expired.
    pub fn file_made_in(&self, ino: u64, changed_ns: i64) {
        if let Some(node) = self.nodes.write().get_mut(&ino) {
            if node.fetched.elapsed() < self.ttl && node.attr.kind == FileKind::Dir {
                node.attr.mtime_ns = node.attr.mtime_ns.max(changed_ns);
                node.attr.ctime_ns = node.attr.ctime_ns.max(changed_ns);
            }
        }
    }

    /// Makes the next attribute request of an inode go to the cluster.
    pub fn expire(&self, ino: u64) {
        if let Some(node) = self.nodes.write().get_mut(&ino) {
            node.fetched = Instant::now() - self.ttl - Duration::from_secs(1);
        }
    }

    /// A cached name, if seen within the TTL, with its attributes.
    pub fn fresh_name(&self, parent: u64, name: &str) -> Option<(u64, Attr)> {
        let (ino, seen) = *self.names.read().get(&(parent, name.to_string()))?;
        if seen.elapsed() >= self.ttl {
            return None;
        }
        let attr = self.fresh_attr(ino)?;
        Some((ino, attr))
    }

    /// Forgets a name (removed, or renamed away).
    pub fn drop_name(&self, parent: u64, name: &str) {
        self.names.write().remove(&(parent, name.to_string()));
    }

    /// A name moved: the inode now lives at (new_parent, new_name).
    pub fn renamed(&self, parent: u64, name: &str, new_parent: u64, new_name: &str) {
        let moved = self.names.write().remove(&(parent, name.to_string()));
        self.names
            .write()
            .remove(&(new_parent, new_name.to_string()));
        let mut nodes = self.nodes.write();
        let ino = match moved {
            Some((ino, _)) => Some(ino),
            None => nodes
                .iter()
                .find(|(_, n)| n.parent == parent && n.name == name)
                .map(|(i, _)| *i),
        };
        if let Some(ino) = ino {
            if let Some(node) = nodes.get_mut(&ino) {
                let to = (new_parent, new_name.to_string());
                match node
                    .others
                    .iter_mut()
                    .find(|(p, n)| *p == parent && n == name)
                {
                    Some(other) => *other = to,
                    None => (node.parent, node.name) = to,
                }
                node.fetched = Instant::now() - self.ttl - Duration::from_secs(1);
            }
        }
    }

    /// Two names swapped their inodes (RENAME_EXCHANGE).
    pub fn exchanged(&self, a_parent: u64, a_name: &str, b_parent: u64, b_name: &str) {
        let (a, b) = (
            self.known_child(a_parent, a_name),
            self.known_child(b_parent, b_name),
        );
        let now = Instant::now();
        {
            let mut names = self.names.write();
            names.remove(&(a_parent, a_name.to_string()));
            names.remove(&(b_parent, b_name.to_string()));
            if let Some(b) = b {
                names.insert((a_parent, a_name.to_string()), (b, now));
            }
            if let Some(a) = a {
                names.insert((b_parent, b_name.to_string()), (a, now));
            }
        }
        let mut nodes = self.nodes.write();
        let stale = now - self.ttl - Duration::from_secs(1);
        let moves = [
            (a, (a_parent, a_name), (b_parent, b_name)),
            (b, (b_parent, b_name), (a_parent, a_name)),
        ];
        for (ino, from, to) in moves {
            let Some(node) = ino.and_then(|i| nodes.get_mut(&i)) else {
                continue;
            };
            let to = (to.0, to.1.to_string());
            match node
                .others
                .iter_mut()
                .find(|(p, n)| *p == from.0 && n == from.1)
            {
                Some(other) => *other = to,
                None => (node.parent, node.name) = to,
            }
            node.fetched = stale;
        }
    }

    /// The inode known under (parent, name), however old.
    pub fn known_child(&self, parent: u64, name: &str) -> Option<u64> {
        if let Some((ino, _)) = self.names.read().get(&(parent, name.to_string())) {
            return Some(*ino);
        }
        self.nodes
            .read()
            .iter()
            .find(|(_, n)| n.parent == parent && n.name == name)
            .map(|(i, _)| *i)
    }

    /// Name `name` of `ino` in `parent` was removed: the inode has one
    /// link less (a directory none), and another name it has, if the
    /// mount knows one, becomes the one its path is built from.
    pub fn unlinked(&self, ino: u64, parent: u64, name: &str) {
        if let Some(node) = self.nodes.write().get_mut(&ino) {
            node.attr.nlink = match node.attr.kind {
                FileKind::Dir => 0,
                _ => node.attr.nlink.saturating_sub(1),
            };
            node.attr.ctime_ns = curvine_messages::now_ns();
            node.others.retain(|(p, n)| !(*p == parent && n == name));
            if node.parent == parent && node.name == name {
                if let Some((p, n)) = node.others.pop() {
                    (node.parent, node.name) = (p, n);
                }
            }
        }
    }

    /// Whether the mount knows a name of `ino` other than `name` in `parent`.
    pub fn has_other_name(&self, ino: u64, parent: u64, name: &str) -> bool {
        self.nodes.read().get(&ino).is_some_and(|node| {
            node.others
                .iter()
                .any(|(p, n)| !(*p == parent && n == name))
                || !(node.parent == parent && node.name == name)
        })
    }

    /// The directory of the name an inode's path is built from.
    pub fn parent_of(&self, ino: u64) -> Option<u64> {
        self.nodes.read().get(&ino).map(|n| n.parent)
    }

    /// Marks an open file that was unlinked and now lives under a hidden name.
    pub fn hide(&self, ino: u64, parent: u64, hidden_name: &str) {
        if let Some(node) = self.nodes.write().get_mut(&ino) {
            node.parent = parent;
            node.name = hidden_name.to_string();
            node.hidden = true;
            node.attr.nlink = node.attr.nlink.saturating_sub(1);
        }
    }

    /// Whether `ino` is hidden, and no longer marked so: of the calls that
    /// race to remove a hidden file, one gets `true`.
    pub fn take_hidden(&self, ino: u64) -> bool {
        self.nodes
            .write()
            .get_mut(&ino)
            .is_some_and(|n| std::mem::take(&mut n.hidden))
    }

    pub fn is_hidden(&self, ino: u64) -> bool {
        self.nodes.read().get(&ino).is_some_and(|n| n.hidden)
    }

    /// Whether the kernel may keep its page cache of a file it opens now,
    /// given the file's current attributes; remembers them for the next open.
    pub fn keep_cache(&self, ino: u64, attr: &Attr) -> bool {
        let version = content_version(attr);
        let mut nodes = self.nodes.write();
        let Some(node) = nodes.get_mut(&ino) else {
            return false;
        };
        let same = node.cached == Some(version);
        node.cached = Some(version);
        same
    }

    /// The page cache of a file no longer matches (it was written here).
    pub fn drop_cached(&self, ino: u64) {
        if let Some(node) = self.nodes.write().get_mut(&ino) {
            node.cached = None;
        }
    }

    /// Kind of a known inode.
    pub fn kind(&self, ino: u64) -> Option<FileKind> {
        self.nodes.read().get(&ino).map(|n| n.attr.kind)
    }

    /// Number of inodes the kernel holds.
    pub fn len(&self) -> usize {
        self.nodes.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A file's content as its attributes tell it (size, mtime, ctime): what
/// the kernel's page cache of it, or a backing file, stands for.
pub type ContentVersion = (u64, i64, i64);

pub fn content_version(attr: &Attr) -> ContentVersion {
    (attr.size, attr.mtime_ns, attr.ctime_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(ino: u64, kind: FileKind) -> Attr {
        Attr {
            ino,
            kind,
            mode: 0o755,
            nlink: 1,
            replicas: 1,
            ..empty_attr()
        }
    }

    #[test]
    fn paths_follow_renames_and_forgets() {
        let t = Inodes::new("/sub", attr(77, FileKind::Dir), Duration::from_secs(1));
        assert_eq!(t.path(ROOT).unwrap(), "/sub");
        assert_eq!(t.fuse_ino(77), ROOT);
        let d = t.remember(ROOT, "d", attr(100, FileKind::Dir));
        let f = t.remember(d, "f", attr(200, FileKind::File));
        assert_eq!(t.path(f).unwrap(), "/sub/d/f");
        t.renamed(ROOT, "d", ROOT, "e");
        assert_eq!(t.path(f).unwrap(), "/sub/e/f");
        assert_eq!(t.known_child(ROOT, "e"), Some(d));
        t.pin(f);
        t.forget(f, 1);
        assert_eq!(
            t.path(f).unwrap(),
            "/sub/e/f",
            "a pinned inode keeps its path"
        );
        t.unpin(f);
        assert!(matches!(t.path(f), Err(FsError::Stale(_))));
        let root = Inodes::new("/", attr(1, FileKind::Dir), Duration::from_secs(1));
        let a = root.remember(ROOT, "a", attr(5, FileKind::File));
        assert_eq!(root.path(a).unwrap(), "/a");
        assert_eq!(root.path(ROOT).unwrap(), "/");
    }

    #[test]
    fn page_cache_kept_only_while_unchanged() {
        let t = Inodes::new("/", attr(1, FileKind::Dir), Duration::from_secs(1));
        let mut a = attr(9, FileKind::File);
        let f = t.remember(ROOT, "f", a.clone());
        assert!(!t.keep_cache(f, &a), "first open has nothing to keep");
        assert!(t.keep_cache(f, &a));
        a.mtime_ns += 1;
        assert!(!t.keep_cache(f, &a), "a changed file drops the cache");
    }

    #[test]
    fn a_file_with_links_keeps_a_path_while_any_name_it_knows_remains() {
        let t = Inodes::new("/", attr(1, FileKind::Dir), Duration::from_secs(1));
        let d = t.remember(ROOT, "d", attr(100, FileKind::Dir));
        let mut f = attr(200, FileKind::File);
        f.nlink = 3;
        let ino = t.remember(ROOT, "a", f.clone());
        t.remember(d, "b", f.clone());
        t.remember(ROOT, "c", f);
        assert_eq!(t.path(ino).unwrap(), "/c");
        assert!(t.has_other_name(ino, ROOT, "c"));
        t.unlinked(ino, ROOT, "c");
        assert_eq!(t.attr(ino).unwrap().nlink, 2);
        let first = t.path(ino).unwrap();
        assert!(first == "/a" || first == "/d/b", "{first}");
        // A name that moves stays one of the inode's names.
        t.renamed(d, "b", ROOT, "moved");
        t.unlinked(ino, ROOT, "a");
        assert_eq!(t.path(ino).unwrap(), "/moved");
        assert!(!t.has_other_name(ino, ROOT, "moved"));
        assert_eq!(t.attr(ino).unwrap().nlink, 1);
    }
}
