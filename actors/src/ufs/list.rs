//! Directory listings of a UFS, a page at a time: the entries of one
//! directory, or every object below one.

use futures::StreamExt;
use opendal::options::ListOptions;
use opendal::ErrorKind;

use curvine_messages::{FsError, FsResult};

use super::{dir_key, object, Scheme, Ufs, UfsObject, UfsPage, UPLOAD_DIR};

impl Ufs {
    /// The key a store that lists in key order starts after, for `cursor`
    /// in directory `rel`.
    fn start_after(&self, rel: &str, cursor: Option<&str>) -> Option<String> {
        match (cursor, self.sorted_listing) {
            (Some(c), true) if rel.is_empty() => Some(c.to_string()),
            (Some(c), true) => Some(format!("{}/{c}", rel.trim_end_matches('/'))),
            _ => None,
        }
    }

    /// Whether a store read whole (not in key order) already returned `key`
    /// on an earlier page.
    fn seen_before(&self, key: &str, cursor: Option<&str>) -> bool {
        !self.sorted_listing && cursor.is_some_and(|c| key <= c)
    }

    /// Up to `limit` entries of directory `rel`, continuing after `cursor`
    /// (the previous page's [`UfsPage::next`]). Stores that list in key
    /// order (S3) are asked one page at a time and their order is kept;
    /// local directories are read and sorted by name. Callers that need
    /// name order sort what they gather.
    pub async fn list_page(
        &self,
        rel: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> FsResult<UfsPage> {
        self.called("list");
        self.traced("list", async {
            let dir = dir_key(rel);
            let limit = limit.max(1);
            let start_after = self.start_after(rel, cursor);
            let mut lister = match self
                .op
                .lister_options(
                    &dir,
                    ListOptions {
                        limit: Some(self.opts.list_page.min(limit)),
                        start_after,
                        ..Default::default()
                    },
                )
                .await
            {
                Ok(l) => l,
                Err(e) if e.kind() == ErrorKind::NotFound && self.uri.scheme == Scheme::File => {
                    return Err(FsError::NotFound(self.uri.join(rel)))
                }
                Err(e) => return Err(self.error("list", rel, e)),
            };
            let mut entries = Vec::new();
            let mut more = false;
            while let Some(entry) = lister.next().await {
                let entry = entry.map_err(|e| self.error("list", rel, e))?;
                if entry.path() == dir || entry.path() == "/" {
                    continue;
                }
                let name = entry.name().trim_end_matches('/').to_string();
                if name.is_empty()
                    || name == "."
                    || name == ".."
                    || name.contains('/')
                    || (rel.is_empty() && name == UPLOAD_DIR)
                {
                    continue;
                }
                if self.seen_before(&name, cursor) {
                    continue;
                }
                if self.sorted_listing && entries.len() == limit {
                    more = true;
                    break;
                }
                entries.push(object(name, entry.metadata()));
            }
            if !self.sorted_listing {
                entries.sort_by(|a, b| a.name.cmp(&b.name));
                more = entries.len() > limit;
                entries.truncate(limit);
            }
            let next = match entries.last() {
                Some(last) if more => Some(if self.sorted_listing && last.is_dir {
                    // Keys below a prefix sort after it: continue past all of them.
                    format!("{}/\u{10FFFF}", last.name)
                } else {
                    last.name.clone()
                }),
                _ => None,
            };
            Ok(UfsPage { entries, next })
        })
        .await
    }

    /// Up to `limit` objects anywhere below directory `rel` (files only,
    /// with their paths relative to `rel`), continuing after `cursor`.
    /// Stores that list in key order page; local directories are read
    /// whole and sorted.
    pub async fn list_tree_page(
        &self,
        rel: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> FsResult<(Vec<(String, UfsObject)>, Option<String>)> {
        self.called("list");
        self.traced("list", async {
            let dir = dir_key(rel);
            let limit = limit.max(1);
            let start_after = self.start_after(rel, cursor);
            let mut lister = self
                .op
                .lister_options(
                    &dir,
                    ListOptions {
                        limit: Some(self.opts.list_page.min(limit)),
                        start_after,
                        recursive: true,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| self.error("list", rel, e))?;
            let mut out = Vec::new();
            let mut more = false;
            while let Some(entry) = lister.next().await {
                let entry = entry.map_err(|e| self.error("list", rel, e))?;
                if entry.metadata().is_dir() {
                    continue;
                }
                let Some(tail) = entry.path().strip_prefix(dir.trim_start_matches('/')) else {
                    continue;
                };
                let tail = tail.trim_start_matches('/').to_string();
                if tail.is_empty()
                    || tail
                        .split('/')
                        .any(|c| c.is_empty() || c == "." || c == "..")
                    || (rel.is_empty() && tail.starts_with(UPLOAD_DIR))
                {
                    continue;
                }
                if self.seen_before(&tail, cursor) {
                    continue;
                }
                if self.sorted_listing && out.len() == limit {
                    more = true;
                    break;
                }
                let name = tail.rsplit('/').next().unwrap_or("").to_string();
                out.push((tail, object(name, entry.metadata())));
            }
            if !self.sorted_listing {
                out.sort_by(|a, b| a.0.cmp(&b.0));
                more = out.len() > limit;
                out.truncate(limit);
            }
            let next = if more {
                out.last().map(|(p, _)| p.clone())
            } else {
                None
            };
            Ok((out, next))
        })
        .await
    }
}
