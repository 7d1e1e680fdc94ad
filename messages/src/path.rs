//! Path validation and normalisation as a shell user expects it.

use crate::error::FsError;
use crate::names;
use crate::types::{MAX_NAME_LEN, MAX_PATH_LEN};

/// Checks one file name: 1 to 255 bytes, no `/`, no NUL, not `.` or `..`,
/// bytes that are not UTF-8 in their one string form (see [`crate::names`]).
pub fn check_name(name: &str) -> Result<(), FsError> {
    if name.is_empty() {
        return Err(FsError::InvalidArgument("empty file name".into()));
    }
    let len = names::byte_len(name);
    if len > MAX_NAME_LEN {
        return Err(FsError::NameTooLong(format!(
            "name of {len} bytes exceeds {MAX_NAME_LEN}"
        )));
    }
    if name == "." || name == ".." {
        return Err(FsError::InvalidArgument(format!(
            "'{name}' cannot be used as a name"
        )));
    }
    if name.contains('/') || name.contains('\0') {
        return Err(FsError::InvalidArgument(format!(
            "name {:?} contains '/' or NUL",
            names::shown(name)
        )));
    }
    names::check(name)
}

/// Normalises a path to its components. Relative paths are taken from `cwd`
/// (itself absolute); `.` is dropped, `..` goes up (and stays at `/` at the
/// top), repeated slashes collapse. Each component and the whole path are
/// checked against the length limits.
pub fn components(path: &str, cwd: &str) -> Result<Vec<String>, FsError> {
    if path.len() > MAX_PATH_LEN {
        return Err(FsError::NameTooLong(format!(
            "path of {} bytes exceeds {MAX_PATH_LEN}",
            path.len()
        )));
    }
    if path.contains('\0') {
        return Err(FsError::InvalidArgument("path contains NUL".into()));
    }
    let mut parts: Vec<String> = Vec::new();
    let joined;
    let full = if path.starts_with('/') {
        path
    } else {
        joined = format!("{cwd}/{path}");
        &joined
    };
    for part in full.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            name => {
                check_name(name)?;
                parts.push(name.to_string());
            }
        }
    }
    Ok(parts)
}

/// Normalises a path to its absolute string form (`/a/b`, `/`).
pub fn normalize(path: &str, cwd: &str) -> Result<String, FsError> {
    Ok(join(&components(path, cwd)?))
}

/// Joins components into an absolute path.
pub fn join(parts: &[String]) -> String {
    if parts.is_empty() {
        "/".to_string()
    } else {
        let mut out = String::new();
        for p in parts {
            out.push('/');
            out.push_str(p);
        }
        out
    }
}

/// The path of `name` in directory `dir` (an absolute path, `/` or without
/// a trailing `/`).
pub fn child(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{}/{name}", dir.trim_end_matches('/'))
    }
}

/// Splits a normalised path into parent components and final name; `None` for `/`.
pub fn split_last(parts: &[String]) -> Option<(&[String], &str)> {
    parts
        .split_last()
        .map(|(last, parent)| (parent, last.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_of_the_root_and_of_directories() {
        assert_eq!(child("/", "a"), "/a");
        assert_eq!(child("/a", "b"), "/a/b");
        assert_eq!(child("/a/", "b"), "/a/b");
    }

    #[test]
    fn normalizes_like_a_shell() {
        assert_eq!(normalize("/a//b/./c/", "/").unwrap(), "/a/b/c");
        assert_eq!(normalize("/a/b/../c", "/").unwrap(), "/a/c");
        assert_eq!(normalize("/../..", "/").unwrap(), "/");
        assert_eq!(normalize("x/y", "/home").unwrap(), "/home/x/y");
        assert_eq!(normalize("..", "/home/u").unwrap(), "/home");
        assert_eq!(normalize("", "/w").unwrap(), "/w");
    }

    #[test]
    fn rejects_bad_names_and_lengths() {
        let long = "n".repeat(256);
        assert!(matches!(
            components(&format!("/{long}"), "/"),
            Err(FsError::NameTooLong(_))
        ));
        assert!(components(&format!("/{}", "n".repeat(255)), "/").is_ok());
        // Longer than PATH_MAX: a deep tree's path from the root.
        let deep = "/abcdefgh".repeat(600);
        assert_eq!(components(&deep, "/").unwrap().len(), 600);
        let too_deep = "/abcdefgh".repeat(120_000);
        assert!(matches!(
            components(&too_deep, "/"),
            Err(FsError::NameTooLong(_))
        ));
        assert!(matches!(
            components("/a\0b", "/"),
            Err(FsError::InvalidArgument(_))
        ));
        assert!(check_name("a/b").is_err());
        assert!(check_name("..").is_err());
        assert!(check_name("").is_err());
        // Bytes that are not UTF-8 count one each.
        let latin1 = names::from_bytes(&[0xE9; 255]).into_owned();
        assert!(check_name(&latin1).is_ok());
        let over = names::from_bytes(&[0xE9; 256]).into_owned();
        assert!(matches!(check_name(&over), Err(FsError::NameTooLong(_))));
    }
}
