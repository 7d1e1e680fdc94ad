//! Listing a bucket in S3's order: the keys under a prefix sorted by their
//! bytes, paged after a marker, with the keys under a delimiter collapsed
//! into common prefixes.
//!
//! A bucket is a tree of directories, so the walk sorts each directory's
//! entries by the key each one starts (`name` for a file, `name/` for a
//! directory) and goes depth first: that visits keys in byte order (a
//! file `a-b` comes before the directory `a/`'s keys, as `-` < `/`). A
//! directory whose keys all sort before the marker is not read at all.

use curvine_client::Client;
use curvine_messages::{Attr, FileKind, FsError, FsResult};

use curvine_messages::path::child;

/// One entry of a listing page.
pub(crate) enum Item {
    Object(String, Box<Attr>),
    Prefix(String),
}

impl Item {
    fn key(&self) -> &str {
        match self {
            Item::Object(k, _) | Item::Prefix(k) => k,
        }
    }
}

pub(crate) struct Page {
    pub items: Vec<Item>,
    /// More items follow the last one.
    pub truncated: bool,
}

/// What to list.
pub(crate) struct Query<'a> {
    pub prefix: &'a str,
    pub delimiter: Option<&'a str>,
    /// Only keys (and prefixes) after this one.
    pub after: &'a str,
    pub max: usize,
}

/// A directory's entries not visited yet, with their keys.
type Frame = std::vec::IntoIter<(String, Attr)>;

/// A page of the bucket at `dir`.
pub(crate) async fn list(client: &Client, dir: &str, q: &Query<'_>) -> FsResult<Page> {
    let (start, first_name) = match q.prefix.rfind('/') {
        Some(i) => (&q.prefix[..=i], &q.prefix[i + 1..]),
        None => ("", q.prefix),
    };
    let mut page = Page {
        items: Vec::new(),
        truncated: false,
    };
    let top = match start {
        "" => dir.to_string(),
        s => child(dir, s.trim_end_matches('/')),
    };
    let mut stack = match read_dir(client, &top, start, Some(first_name)).await {
        Ok(frame) => vec![frame],
        Err(FsError::NotFound(_) | FsError::NotADirectory(_)) => return Ok(page),
        Err(e) => return Err(e),
    };
    let slash = q.delimiter == Some("/");
    let other_delimiter = q.delimiter.filter(|d| !d.is_empty() && *d != "/");
    while let Some(frame) = stack.last_mut() {
        let Some((key, attr)) = frame.next() else {
            stack.pop();
            continue;
        };
        let item = match attr.kind {
            FileKind::Dir if slash => Item::Prefix(key),
            FileKind::Dir => {
                if key.as_str() > q.after || q.after.starts_with(key.as_str()) {
                    let path = child(dir, key.trim_end_matches('/'));
                    match read_dir(client, &path, &key, None).await {
                        Ok(frame) => stack.push(frame),
                        // Removed since its parent was read.
                        Err(FsError::NotFound(_) | FsError::NotADirectory(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
                continue;
            }
            FileKind::File => {
                match other_delimiter.and_then(|d| common_prefix(q.prefix, &key, d)) {
                    Some(p) => Item::Prefix(p),
                    None => Item::Object(key, Box::new(attr)),
                }
            }
            _ => continue,
        };
        if item.key() <= q.after {
            continue;
        }
        if let (Item::Prefix(p), Some(Item::Prefix(last))) = (&item, page.items.last()) {
            if p == last {
                continue;
            }
        }
        if page.items.len() == q.max {
            page.truncated = true;
            break;
        }
        page.items.push(item);
    }
    Ok(page)
}

/// The common prefix `key` falls under: `prefix` and what follows it up to
/// and including the first `delimiter`.
fn common_prefix(prefix: &str, key: &str, delimiter: &str) -> Option<String> {
    let rest = key.strip_prefix(prefix)?;
    let i = rest.find(delimiter)?;
    Some(format!("{prefix}{}", &rest[..i + delimiter.len()]))
}

/// The entries of the directory at `path` whose keys start with
/// `keys` + `first` (when given), sorted by key.
async fn read_dir(client: &Client, path: &str, keys: &str, first: Option<&str>) -> FsResult<Frame> {
    let mut entries: Vec<(String, Attr)> = client
        .list_all(path)
        .await?
        .into_iter()
        .filter(|e| first.is_none_or(|f| e.name.starts_with(f)))
        .map(|e| {
            let key = match e.attr.kind {
                FileKind::Dir => format!("{keys}{}/", e.name),
                _ => format!("{keys}{}", e.name),
            };
            (key, e.attr)
        })
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(entries.into_iter())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefixes_end_at_the_first_delimiter() {
        assert_eq!(common_prefix("a", "a-b-c", "-").as_deref(), Some("a-"));
        assert_eq!(common_prefix("", "x/y/z", "/").as_deref(), Some("x/"));
        assert_eq!(common_prefix("x/", "x/y", "/"), None);
    }
}
