//! The ready file: once a node serves, it writes its ports, node id and
//! process id to `ready.json` in its data directory, for operators'
//! scripts and the test harness (instead of reading its log). It is written
//! by rename, so a reader sees all of it or none, and removed when the node
//! stops cleanly. A file left by a node that was killed names a process
//! that is gone (or another one): check `pid` before trusting it.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The name of the ready file in a data directory.
pub const READY_FILE: &str = "ready.json";

/// What `ready.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    pub node_id: String,
    pub cluster_id: String,
    pub pid: u32,
    /// Client port.
    pub client_addr: String,
    /// Cluster port.
    pub cluster_addr: String,
    /// Data port.
    pub data_addr: String,
    /// HTTP port (dashboard, API, metrics); empty when `http.listen = "off"`.
    pub http_addr: String,
    /// The S3 gateway; empty when `s3.listen = "off"`.
    #[serde(default)]
    pub s3_addr: String,
    /// When the node started (ns since the epoch).
    pub started_ns: i64,
}

impl Ready {
    /// Writes the ready file of data directory `dir`.
    pub fn write(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let path = dir.join(READY_FILE);
        let tmp = dir.join(format!("{READY_FILE}.tmp"));
        let mut text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        text.push('\n');
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// The ready file of data directory `dir`, if there is one.
    pub fn read(dir: &Path) -> std::io::Result<Ready> {
        let text = std::fs::read_to_string(dir.join(READY_FILE))?;
        serde_json::from_str(&text).map_err(std::io::Error::other)
    }

    /// Removes the ready file of `dir` (a clean stop).
    pub fn remove(dir: &Path) {
        let _ = std::fs::remove_file(dir.join(READY_FILE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let ready = Ready {
            node_id: "n1".into(),
            cluster_id: "c".into(),
            pid: 42,
            client_addr: "127.0.0.1:8995".into(),
            cluster_addr: "127.0.0.1:8996".into(),
            data_addr: "127.0.0.1:8997".into(),
            http_addr: String::new(),
            s3_addr: String::new(),
            started_ns: 7,
        };
        ready.write(dir.path()).unwrap();
        assert_eq!(Ready::read(dir.path()).unwrap(), ready);
        let again = Ready { pid: 43, ..ready };
        again.write(dir.path()).unwrap();
        assert_eq!(Ready::read(dir.path()).unwrap().pid, 43);
        assert!(!dir.path().join("ready.json.tmp").exists());
        Ready::remove(dir.path());
        assert!(Ready::read(dir.path()).is_err());
    }
}
