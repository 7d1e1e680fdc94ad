//! Validation: values that parse but make no sense stop loading with an
//! error naming the key, the value, where it came from and what is allowed.

use crate::derived::TierSpec;
use crate::error::{ConfError, Source};
use crate::schema::Config;

fn check_addr(key: &str, addr: &str, source: Source) -> Result<(), ConfError> {
    let ok = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if ok {
        Ok(())
    } else {
        Err(ConfError::InvalidValue {
            key: key.into(),
            value: format!("{addr:?}"),
            origin: source,
            allowed: "expected host:port with a port from 0 to 65535".into(),
        })
    }
}

/// Makes the error for a key's value, with the source of the key.
fn invalid_value<'a>(
    source: &'a dyn Fn(&str) -> Source,
) -> impl Fn(&str, String, &str) -> ConfError + 'a {
    move |key: &str, value: String, allowed: &str| ConfError::InvalidValue {
        key: key.into(),
        value,
        origin: source(key),
        allowed: allowed.into(),
    }
}

impl Config {
    /// Checks values that parse but make no sense. `source` names where a key came from.
    pub fn validate(&self, source: impl Fn(&str) -> Source) -> Result<(), ConfError> {
        // The groups run in this order, so the first bad key found stays
        // the same whatever else is wrong.
        let source: &dyn Fn(&str) -> Source = &source;
        self.check_cluster_and_client(source)?;
        self.check_meta_and_trace(source)?;
        self.check_data_and_timings(source)?;
        self.check_ufs_and_ports(source)?;
        self.check_tls(source)?;
        self.check_fuse_and_supervisor(source)
    }

    /// The shard count, the node's addresses and seeds, the client's nodes and connections.
    fn check_cluster_and_client(&self, source: &dyn Fn(&str) -> Source) -> Result<(), ConfError> {
        let invalid = invalid_value(source);
        if !(1..=256).contains(&self.cluster.shards) {
            return Err(invalid(
                "cluster.shards",
                self.cluster.shards.to_string(),
                "expected 1 to 256",
            ));
        }
        if self.node.max_connections == 0 {
            return Err(invalid(
                "node.max_connections",
                "0".into(),
                "expected at least 1",
            ));
        }
        check_addr("node.listen", &self.node.listen, source("node.listen"))?;
        if !self.node.cluster_listen.is_empty() {
            check_addr(
                "node.cluster_listen",
                &self.node.cluster_listen,
                source("node.cluster_listen"),
            )?;
        }
        for seed in &self.node.seeds {
            check_addr("node.seeds", seed, source("node.seeds"))?;
        }
        if self.client.cluster.is_empty() {
            return Err(invalid(
                "client.cluster",
                "[]".into(),
                "expected at least one host:port",
            ));
        }
        for addr in &self.client.cluster {
            check_addr("client.cluster", addr, source("client.cluster"))?;
        }
        if self.client.connections == 0 || self.client.connections > 64 {
            return Err(invalid(
                "client.connections",
                self.client.connections.to_string(),
                "expected 1 to 64",
            ));
        }
        Ok(())
    }

    /// The metadata store, the log and the trace ring.
    fn check_meta_and_trace(&self, source: &dyn Fn(&str) -> Source) -> Result<(), ConfError> {
        let invalid = invalid_value(source);
        if !matches!(self.meta.layout.as_str(), "node" | "shard") {
            return Err(invalid(
                "meta.layout",
                format!("{:?}", self.meta.layout),
                "expected \"node\" or \"shard\"",
            ));
        }
        if !((1 << 20)..=(4 << 30)).contains(&self.meta.wal_size.0) {
            return Err(invalid(
                "meta.wal_size",
                self.meta.wal_size.to_string(),
                "expected 1MiB to 4GiB",
            ));
        }
        let interval = self.meta.checkpoint_interval.0;
        if interval < std::time::Duration::from_millis(10)
            || interval > std::time::Duration::from_secs(3600)
        {
            return Err(invalid(
                "meta.checkpoint_interval",
                self.meta.checkpoint_interval.to_string(),
                "expected 10ms to 1h",
            ));
        }
        if self.meta.commit_delay.0 > std::time::Duration::from_millis(100) {
            return Err(invalid(
                "meta.commit_delay",
                self.meta.commit_delay.to_string(),
                "expected at most 100ms",
            ));
        }
        if !(1_000..=10_000_000).contains(&self.trace.ring_events) {
            return Err(invalid(
                "trace.ring_events",
                self.trace.ring_events.to_string(),
                "expected 1000 to 10000000",
            ));
        }
        if !(0.0..=1.0).contains(&self.trace.sample_rate) {
            return Err(invalid(
                "trace.sample_rate",
                self.trace.sample_rate.to_string(),
                "expected a share from 0 to 1",
            ));
        }
        if self.meta.group_commit_max == 0 {
            return Err(invalid(
                "meta.group_commit_max",
                "0".into(),
                "expected at least 1",
            ));
        }
        if self.meta.map_size.0 < (16 << 20) {
            return Err(invalid(
                "meta.map_size",
                self.meta.map_size.to_string(),
                "expected at least 16MiB",
            ));
        }
        if self.meta.max_readers < 8 {
            return Err(invalid(
                "meta.max_readers",
                self.meta.max_readers.to_string(),
                "expected at least 8",
            ));
        }
        if !(1..=7).contains(&self.meta.replicas) {
            return Err(invalid(
                "meta.replicas",
                self.meta.replicas.to_string(),
                "expected 1 to 7 copies",
            ));
        }
        Ok(())
    }

    /// The request timeout, the data port, tiers, blocks and watermarks, heartbeats and leases.
    fn check_data_and_timings(&self, source: &dyn Fn(&str) -> Source) -> Result<(), ConfError> {
        let invalid = invalid_value(source);
        if self.client.request_timeout.0.is_zero() {
            return Err(invalid(
                "client.request_timeout",
                "0s".into(),
                "expected more than 0s",
            ));
        }
        if !self.data.listen.is_empty() {
            check_addr("data.listen", &self.data.listen, source("data.listen"))?;
        }
        let mut seen_paths = Vec::new();
        for tier in &self.data.tiers {
            let spec = TierSpec::parse(tier)
                .map_err(|e| invalid("data.tiers", format!("{tier:?}"), &e))?;
            if seen_paths.contains(&spec.path) {
                return Err(invalid(
                    "data.tiers",
                    format!("{tier:?}"),
                    "each tier needs a directory of its own",
                ));
            }
            seen_paths.push(spec.path);
        }
        let bs = self.data.block_size.0;
        if !(64 << 10..=2 << 30).contains(&bs) || !bs.is_multiple_of(64 << 10) {
            return Err(invalid(
                "data.block_size",
                self.data.block_size.to_string(),
                "expected a multiple of 64KiB from 64KiB to 2GiB",
            ));
        }
        for (key, value) in [
            ("data.replicas", self.data.replicas),
            ("ufs.pending_replicas", u32::from(self.ufs.pending_replicas)),
        ] {
            if !(1..=16).contains(&value) {
                return Err(invalid(key, value.to_string(), "expected 1 to 16"));
            }
        }
        let (low, high) = (self.data.low_watermark, self.data.high_watermark);
        if !(0.0 < low && low < high && high <= 1.0) {
            return Err(invalid(
                "data.low_watermark",
                format!("{low} (high_watermark {high})"),
                "expected 0 < low_watermark < high_watermark <= 1",
            ));
        }
        if self.cluster.heartbeat.0 < std::time::Duration::from_millis(50) {
            return Err(invalid(
                "cluster.heartbeat",
                self.cluster.heartbeat.to_string(),
                "expected at least 50ms",
            ));
        }
        if self.cluster.node_timeout.0 < self.cluster.heartbeat.0 * 2 {
            return Err(invalid(
                "cluster.node_timeout",
                self.cluster.node_timeout.to_string(),
                "expected at least twice cluster.heartbeat",
            ));
        }
        if self.data.write_lease.0 < std::time::Duration::from_secs(1) {
            return Err(invalid(
                "data.write_lease",
                self.data.write_lease.to_string(),
                "expected at least 1s",
            ));
        }
        if self.data.evict_interval.0.is_zero() {
            return Err(invalid(
                "data.evict_interval",
                "0s".into(),
                "expected more than 0s",
            ));
        }
        Ok(())
    }

    /// The UFS client, token lifetime, and the metrics and HTTP ports.
    fn check_ufs_and_ports(&self, source: &dyn Fn(&str) -> Source) -> Result<(), ConfError> {
        let invalid = invalid_value(source);
        if self.ufs.part_size.0 < (5 << 20) || self.ufs.part_size.0 > (5 << 30) {
            return Err(invalid(
                "ufs.part_size",
                self.ufs.part_size.to_string(),
                "expected 5MiB to 5GiB (S3's limits for a part)",
            ));
        }
        for (key, value) in [
            ("ufs.upload_concurrency", self.ufs.upload_concurrency),
            ("ufs.list_page", self.ufs.list_page),
            ("ufs.loaders", self.ufs.loaders),
        ] {
            if !(1..=10_000).contains(&value) {
                return Err(invalid(key, value.to_string(), "expected 1 to 10000"));
            }
        }
        if self.ufs.timeout.0.is_zero() || self.ufs.io_timeout.0.is_zero() {
            return Err(invalid(
                "ufs.timeout",
                format!("{} / {}", self.ufs.timeout, self.ufs.io_timeout),
                "ufs.timeout and ufs.io_timeout must be above 0",
            ));
        }
        if self.data.token_ttl.0 < std::time::Duration::from_secs(60) {
            return Err(invalid(
                "data.token_ttl",
                self.data.token_ttl.to_string(),
                "expected at least 1m",
            ));
        }
        if self.fuse.metrics_listen != "off" {
            check_addr(
                "fuse.metrics_listen",
                &self.fuse.metrics_listen,
                source("fuse.metrics_listen"),
            )?;
        }
        if !self.http.listen.is_empty() && self.http.listen != "off" {
            check_addr("http.listen", &self.http.listen, source("http.listen"))?;
        }
        if self.http.history_interval.0 < std::time::Duration::from_millis(100) {
            return Err(invalid(
                "http.history_interval",
                self.http.history_interval.to_string(),
                "expected at least 100ms",
            ));
        }
        if self.s3.listen != "off" {
            check_addr("s3.listen", &self.s3.listen, source("s3.listen"))?;
            if self.s3.access_key.is_empty() || self.s3.secret_key.is_empty() {
                return Err(invalid(
                    "s3.listen",
                    self.s3.listen.clone(),
                    "the S3 gateway needs s3.access_key and s3.secret_key (it serves no anonymous requests)",
                ));
            }
        }
        if !self.s3.root.starts_with('/') {
            return Err(invalid(
                "s3.root",
                self.s3.root.clone(),
                "expected an absolute path (the directory holding the buckets)",
            ));
        }
        Ok(())
    }

    /// TLS: a CA when on, a certificate with its key, a handshake timeout.
    fn check_tls(&self, source: &dyn Fn(&str) -> Source) -> Result<(), ConfError> {
        let invalid = invalid_value(source);
        if self.tls.enabled && self.tls.ca.is_empty() {
            return Err(invalid(
                "tls.ca",
                "\"\"".into(),
                "expected the PEM file of the certificate authority that signs the nodes' \
                 certificates (tls.enabled is true)",
            ));
        }
        if self.tls.cert.is_empty() != self.tls.key.is_empty() {
            let (key, other) = if self.tls.key.is_empty() {
                ("tls.key", "tls.cert")
            } else {
                ("tls.cert", "tls.key")
            };
            return Err(invalid(
                key,
                "\"\"".into(),
                &format!("expected a PEM file, since {other} is set (a certificate needs its key)"),
            ));
        }
        if self.tls.handshake_timeout.0.is_zero() {
            return Err(invalid(
                "tls.handshake_timeout",
                self.tls.handshake_timeout.to_string(),
                "expected more than 0",
            ));
        }
        Ok(())
    }

    /// The FUSE mount and the supervisor's restart budget.
    fn check_fuse_and_supervisor(&self, source: &dyn Fn(&str) -> Source) -> Result<(), ConfError> {
        let invalid = invalid_value(source);
        if self.fuse.acl && !self.fuse.default_permissions {
            return Err(invalid(
                "fuse.acl",
                "true".into(),
                "ACLs are enforced by the kernel's permission checks: fuse.default_permissions must be true",
            ));
        }
        if !(1..=64).contains(&self.fuse.threads) {
            return Err(invalid(
                "fuse.threads",
                self.fuse.threads.to_string(),
                "expected 1 to 64",
            ));
        }
        let mw = self.fuse.max_write.0;
        if !(4096..=16 << 20).contains(&mw) {
            return Err(invalid(
                "fuse.max_write",
                self.fuse.max_write.to_string(),
                "expected 4KiB to 16MiB",
            ));
        }
        if self.fuse.max_readahead.0 < 4096 {
            return Err(invalid(
                "fuse.max_readahead",
                self.fuse.max_readahead.to_string(),
                "expected at least 4KiB",
            ));
        }
        let fbs = self.fuse.block_size.0;
        if fbs != 0 && (!(64 << 10..=2 << 30).contains(&fbs) || !fbs.is_multiple_of(64 << 10)) {
            return Err(invalid(
                "fuse.block_size",
                self.fuse.block_size.to_string(),
                "expected 0 (the cluster's) or a multiple of 64KiB from 64KiB to 2GiB",
            ));
        }
        if !self.fuse.fs_path.starts_with('/') {
            return Err(invalid(
                "fuse.fs_path",
                format!("{:?}", self.fuse.fs_path),
                "expected an absolute path of the namespace",
            ));
        }
        if self.supervisor.max_restarts == 0 {
            return Err(invalid(
                "supervisor.max_restarts",
                "0".into(),
                "expected at least 1",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::Loader;

    #[test]
    fn tls_settings_that_cannot_work_name_the_key() {
        let build = |kvs: &[&str]| {
            let mut l = Loader::new();
            for kv in kvs {
                l.key_value(kv).unwrap();
            }
            l.build()
        };
        let err = build(&["tls.enabled=true"]).unwrap_err().to_string();
        assert!(
            err.contains("tls.ca") && err.contains("certificate authority"),
            "{err}"
        );
        let err = build(&["tls.cert=/etc/n.pem"]).unwrap_err().to_string();
        assert!(
            err.contains("'tls.key'") && err.contains("tls.cert is set"),
            "{err}"
        );
        let err = build(&["tls.key=/etc/n.key"]).unwrap_err().to_string();
        assert!(err.contains("'tls.cert'"), "{err}");
        let err = build(&["tls.handshake_timeout=0s"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("tls.handshake_timeout"), "{err}");
        let c = build(&["tls.enabled=true", "tls.ca=/etc/ca.pem"]).unwrap();
        assert!(c.tls.enabled && c.tls.data && c.tls.cert.is_empty());
    }

    #[test]
    fn an_s3_gateway_needs_its_keys_and_hides_its_secret() {
        let loader = |kvs: &[&str]| {
            let mut l = Loader::new();
            for kv in kvs {
                l.key_value(kv).unwrap();
            }
            l
        };
        let err = loader(&["s3.listen=127.0.0.1:9000", "s3.access_key=a"])
            .build()
            .unwrap_err()
            .to_string();
        assert!(err.contains("s3.secret_key"), "{err}");
        let err = loader(&["s3.listen=nowhere"])
            .build()
            .unwrap_err()
            .to_string();
        assert!(err.contains("s3.listen"), "{err}");
        let err = loader(&["s3.root=data"]).build().unwrap_err().to_string();
        assert!(err.contains("s3.root"), "{err}");
        let l = loader(&[
            "s3.listen=127.0.0.1:9000",
            "s3.access_key=a",
            "s3.secret_key=hush",
        ]);
        let c = l.build().unwrap();
        assert!(!format!("{c:?}").contains("hush"));
        let shown: Vec<String> = l.entries().iter().map(|e| e.value.clone()).collect();
        assert!(!shown.iter().any(|v| v.contains("hush")), "{shown:?}");
    }
}
