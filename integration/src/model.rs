//! A plain in-memory model of the namespace's POSIX rules, to compare the
//! cluster against.

use std::collections::BTreeMap;

use curvine_messages::FileKind;

/// An operation on paths, as the property and crash tests generate them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Mkdir(String),
    Create(String),
    Symlink(String),
    Rename(String, String),
    Unlink(String),
    Rmdir(String),
}

/// Symlinks point here, a path that never exists, so a path through a
/// symlink resolves to "no such file".
pub const SYMLINK_TARGET: &str = "/never/there";

/// Path -> kind of everything below the model's root (the root itself is implicit).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Model {
    pub root: String,
    pub entries: BTreeMap<String, FileKind>,
}

fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

impl Model {
    pub fn new(root: &str) -> Model {
        Model {
            root: root.to_string(),
            entries: BTreeMap::new(),
        }
    }

    fn kind(&self, path: &str) -> Option<FileKind> {
        if path == self.root {
            Some(FileKind::Dir)
        } else {
            self.entries.get(path).copied()
        }
    }

    /// Error kind for a path whose parent must be an existing directory.
    fn check_parent(&self, path: &str) -> Result<(), &'static str> {
        // Walk the ancestors from the root down, as resolution does.
        let p = parent(path);
        let mut ancestors = vec![p];
        let mut cur = p;
        while cur != self.root && cur != "/" {
            cur = parent(cur);
            ancestors.push(cur);
        }
        for a in ancestors.into_iter().rev() {
            match self.kind(a) {
                Some(FileKind::Dir) => {}
                // The symlink target never exists.
                Some(FileKind::Symlink) | None => return Err("not_found"),
                Some(_) => return Err("not_a_directory"),
            }
        }
        Ok(())
    }

    fn has_children(&self, path: &str) -> bool {
        let prefix = format!("{path}/");
        self.entries
            .range(prefix.clone()..)
            .next()
            .is_some_and(|(k, _)| k.starts_with(&prefix))
    }

    /// Applies an operation; returns the error kind name it must fail with.
    pub fn apply(&mut self, op: &Op) -> Result<(), &'static str> {
        match op {
            Op::Mkdir(p) | Op::Create(p) | Op::Symlink(p) => {
                self.check_parent(p)?;
                if self.kind(p).is_some() {
                    return Err("already_exists");
                }
                let kind = match op {
                    Op::Mkdir(_) => FileKind::Dir,
                    Op::Create(_) => FileKind::File,
                    _ => FileKind::Symlink,
                };
                self.entries.insert(p.clone(), kind);
                Ok(())
            }
            Op::Unlink(p) => {
                self.check_parent(p)?;
                match self.kind(p) {
                    None => Err("not_found"),
                    Some(FileKind::Dir) => Err("is_a_directory"),
                    Some(_) => {
                        self.entries.remove(p);
                        Ok(())
                    }
                }
            }
            Op::Rmdir(p) => {
                self.check_parent(p)?;
                match self.kind(p) {
                    None => Err("not_found"),
                    Some(FileKind::Dir) if self.has_children(p) => Err("not_empty"),
                    Some(FileKind::Dir) => {
                        self.entries.remove(p);
                        Ok(())
                    }
                    Some(_) => Err("not_a_directory"),
                }
            }
            Op::Rename(a, b) => {
                self.check_parent(a)?;
                let Some(src) = self.kind(a) else {
                    return Err("not_found");
                };
                self.check_parent(b)?;
                if a == b {
                    return Ok(());
                }
                if src == FileKind::Dir && b.starts_with(&format!("{a}/")) {
                    return Err("invalid_argument");
                }
                if let Some(dst) = self.kind(b) {
                    match (src == FileKind::Dir, dst == FileKind::Dir) {
                        (true, false) => return Err("not_a_directory"),
                        (false, true) => return Err("is_a_directory"),
                        (true, true) if self.has_children(b) => return Err("not_empty"),
                        _ => {}
                    }
                    self.entries.remove(b);
                }
                let prefix = format!("{a}/");
                let moved: Vec<(String, FileKind)> = self
                    .entries
                    .iter()
                    .filter(|(k, _)| *k == a || k.starts_with(&prefix))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                for (k, _) in &moved {
                    self.entries.remove(k);
                }
                for (k, v) in moved {
                    let new = format!("{b}{}", &k[a.len()..]);
                    self.entries.insert(new, v);
                }
                Ok(())
            }
        }
    }
}

/// Runs an operation against the cluster; returns the error kind name.
pub async fn run(client: &curvine_client::Client, op: &Op) -> Result<(), String> {
    run_full(client, op)
        .await
        .map_err(|e| e.kind_name().to_string())
}

/// Runs an operation against the cluster; returns the error as it came.
pub async fn run_full(
    client: &curvine_client::Client,
    op: &Op,
) -> Result<(), curvine_messages::FsError> {
    match op {
        Op::Mkdir(p) => client.mkdir(p, false).await.map(|_| ()),
        Op::Create(p) => client.create(p).await.map(|_| ()),
        Op::Symlink(p) => client.symlink(SYMLINK_TARGET, p).await.map(|_| ()),
        Op::Rename(a, b) => client.rename(a, b).await,
        Op::Unlink(p) => client.remove(p, false).await.map(|_| ()),
        Op::Rmdir(p) => client.rmdir(p).await.map(|_| ()),
    }
}

/// Everything below `root` in the cluster, as path -> kind.
pub async fn snapshot(client: &curvine_client::Client, root: &str) -> BTreeMap<String, FileKind> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_string()];
    while let Some(dir) = stack.pop() {
        for entry in client.list_all(&dir).await.expect("list") {
            let path = format!("{dir}/{}", entry.name);
            if entry.attr.kind == FileKind::Dir {
                stack.push(path.clone());
            }
            out.insert(path, entry.attr.kind);
        }
    }
    out
}
