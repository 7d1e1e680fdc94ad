//! Values derived from the config: the data directory, the addresses of
//! the ports, and the storage tiers parsed (`TierSpec`).

use std::path::PathBuf;

use crate::schema::Config;
use crate::units::ByteSize;

/// A storage tier as configured: `[TYPE:CAPACITY]path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierSpec {
    /// `MEM`, `SSD` or `HDD`.
    pub kind: String,
    pub capacity: u64,
    pub path: PathBuf,
}

impl TierSpec {
    pub fn parse(text: &str) -> Result<TierSpec, String> {
        let bad = |why: &str| {
            format!("tier {text:?}: {why} (expected [MEM|SSD|HDD:CAPACITY]/path, e.g. [MEM:4GiB]/dev/shm/curvine)")
        };
        let rest = text
            .trim()
            .strip_prefix('[')
            .ok_or_else(|| bad("missing '['"))?;
        let (head, path) = rest.split_once(']').ok_or_else(|| bad("missing ']'"))?;
        let (kind, capacity) = head
            .split_once(':')
            .ok_or_else(|| bad("missing ':' between type and capacity"))?;
        let kind = kind.trim().to_ascii_uppercase();
        if !matches!(kind.as_str(), "MEM" | "SSD" | "HDD") {
            return Err(bad("type must be MEM, SSD or HDD"));
        }
        let capacity = ByteSize::parse(capacity).map_err(|e| bad(&e))?.0;
        if capacity < (1 << 20) {
            return Err(bad("capacity must be at least 1MiB"));
        }
        let path = path.trim();
        if !path.starts_with('/') {
            return Err(bad("path must be absolute"));
        }
        Ok(TierSpec {
            kind,
            capacity,
            path: PathBuf::from(path),
        })
    }
}

impl Config {
    /// The data directory: the configured one, or the user's default.
    pub fn data_dir(&self) -> PathBuf {
        if !self.node.data_dir.is_empty() {
            return expand_home(&self.node.data_dir);
        }
        match std::env::var("HOME") {
            Ok(home) if !home.is_empty() => PathBuf::from(home).join(".curvine").join("data"),
            _ => PathBuf::from("/var/lib/curvine"),
        }
    }

    /// The cluster port address: configured, or the client port + 1.
    pub fn cluster_listen(&self) -> String {
        if !self.node.cluster_listen.is_empty() {
            return self.node.cluster_listen.clone();
        }
        self.client_port_plus(1)
    }

    /// The HTTP port address: configured, or loopback on the client port
    /// + 3; `None` when it is `off`.
    pub fn http_listen(&self) -> Option<String> {
        match self.http.listen.as_str() {
            "off" => None,
            "" => {
                let port = self
                    .client_port_plus(3)
                    .rsplit_once(':')
                    .map(|(_, p)| p.to_string())
                    .unwrap_or_else(|| "8998".into());
                Some(format!("127.0.0.1:{port}"))
            }
            addr => Some(addr.to_string()),
        }
    }

    /// The data port address: configured, or the client port + 2.
    pub fn data_listen(&self) -> String {
        if !self.data.listen.is_empty() {
            return self.data.listen.clone();
        }
        self.client_port_plus(2)
    }

    /// The client port's host with its port + `n`; port 0 stays 0 (any port).
    fn client_port_plus(&self, n: u16) -> String {
        match self.node.listen.rsplit_once(':') {
            Some((host, port)) => {
                let port: u16 = port.parse().unwrap_or(8995);
                let port = if port == 0 { 0 } else { port.wrapping_add(n) };
                format!("{host}:{port}")
            }
            None => format!("127.0.0.1:{}", 8995 + n),
        }
    }

    /// The configured tiers, parsed (validated by [`Config::validate`]).
    pub fn tiers(&self) -> Vec<TierSpec> {
        self.data
            .tiers
            .iter()
            .filter_map(|t| TierSpec::parse(t).ok())
            .collect()
    }
}

fn expand_home(path: &str) -> PathBuf {
    if let Some(rest) = path.strip_prefix("~/") {
        if let Ok(home) = std::env::var("HOME") {
            return PathBuf::from(home).join(rest);
        }
    }
    PathBuf::from(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Loader;

    #[test]
    fn tiers_parse_and_bad_ones_name_the_problem() {
        let t = TierSpec::parse("[mem:4GiB]/dev/shm/c").unwrap();
        assert_eq!((t.kind.as_str(), t.capacity), ("MEM", 4 << 30));
        assert_eq!(t.path, PathBuf::from("/dev/shm/c"));
        for (bad, why) in [
            ("MEM:4GiB/x", "missing '['"),
            ("[TAPE:1GiB]/x", "MEM, SSD or HDD"),
            ("[SSD:lots]/x", "not a size"),
            ("[SSD:1KiB]/x", "at least 1MiB"),
            ("[HDD:1GiB]relative", "absolute"),
        ] {
            let err = TierSpec::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
        let mut l = Loader::new();
        let err = l
            .key_value("data.tiers=[MEM:1GiB]/a,[SSD:1GiB]/a")
            .and_then(|l| l.build())
            .unwrap_err();
        assert!(err.to_string().contains("directory of its own"), "{err}");
    }

    #[test]
    fn cluster_port_follows_client_port() {
        let mut c = Config::default();
        c.node.listen = "10.0.0.1:7000".into();
        assert_eq!(c.cluster_listen(), "10.0.0.1:7001");
    }
}
