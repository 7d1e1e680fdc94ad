//! What configures a UFS client: the mount properties a scheme accepts
//! (checked, and redacted for display) and the request limits from the
//! node's `ufs.*` settings.

use std::collections::BTreeMap;
use std::time::Duration;

use curvine_conf::UfsConf;
use curvine_messages::{FsError, FsResult};

use super::{Scheme, UfsUri};

/// Mount properties an `s3://` mount accepts (`-c key=value`), with what they mean.
pub const S3_KEYS: &[(&str, &str)] = &[
    (
        "s3.endpoint_url",
        "endpoint of an S3-compatible store, e.g. http://host:9000 (default: AWS)",
    ),
    ("s3.region_name", "region of the bucket (default us-east-1)"),
    ("s3.credentials.access", "access key id"),
    ("s3.credentials.secret", "secret access key"),
    (
        "s3.credentials.session_token",
        "session token of temporary credentials",
    ),
    (
        "s3.force.path.style",
        "true: http://endpoint/bucket/key (default); false: http://bucket.endpoint/key",
    ),
];

pub use curvine_messages::mount::is_secret;

/// The properties with secret values replaced, for display.
pub fn redacted(props: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    props
        .iter()
        .map(|(k, v)| {
            let v = if is_secret(k) {
                "<redacted>".to_string()
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect()
}

/// Checks mount properties against what the scheme accepts.
pub fn check_props(uri: &UfsUri, props: &BTreeMap<String, String>) -> FsResult<()> {
    let allowed: &[(&str, &str)] = match uri.scheme {
        Scheme::S3 => S3_KEYS,
        Scheme::File => &[],
    };
    for (key, value) in props {
        if !allowed.iter().any(|(k, _)| k == key) {
            let names: Vec<&str> = allowed.iter().map(|(k, _)| *k).collect();
            return Err(FsError::InvalidArgument(format!(
                "unknown mount property {key:?} for {uri}; allowed: {}",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            )));
        }
        if key == "s3.force.path.style" && !matches!(value.as_str(), "true" | "false") {
            return Err(FsError::InvalidArgument(format!(
                "mount property s3.force.path.style={value:?}: expected true or false"
            )));
        }
        if key == "s3.endpoint_url"
            && !(value.starts_with("http://") || value.starts_with("https://"))
        {
            return Err(FsError::InvalidArgument(format!(
                "mount property s3.endpoint_url={value:?}: expected http://host:port or https://host"
            )));
        }
    }
    let has = |k: &str| props.contains_key(k);
    if has("s3.credentials.access") != has("s3.credentials.secret") {
        return Err(FsError::InvalidArgument(
            "give both s3.credentials.access and s3.credentials.secret, or neither".into(),
        ));
    }
    Ok(())
}

/// Request limits of a UFS client, from the node's `ufs.*` config.
#[derive(Debug, Clone)]
pub struct UfsOptions {
    pub timeout: Duration,
    pub io_timeout: Duration,
    pub retries: usize,
    pub retry_min_delay: Duration,
    pub retry_max_delay: Duration,
    pub part_size: usize,
    pub upload_concurrency: usize,
    pub list_page: usize,
}

impl From<&UfsConf> for UfsOptions {
    fn from(c: &UfsConf) -> UfsOptions {
        UfsOptions {
            timeout: c.timeout.0,
            io_timeout: c.io_timeout.0,
            retries: c.retries as usize,
            retry_min_delay: c.retry_min_delay.0,
            retry_max_delay: c.retry_max_delay.0,
            part_size: c.part_size.0 as usize,
            upload_concurrency: c.upload_concurrency as usize,
            list_page: c.list_page as usize,
        }
    }
}

impl Default for UfsOptions {
    fn default() -> UfsOptions {
        UfsOptions::from(&UfsConf::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn props_are_checked_and_secrets_redacted() {
        let u = UfsUri::parse("s3://bucket/x").unwrap();
        let mut p = BTreeMap::new();
        p.insert("s3.credentials.access".to_string(), "AK".to_string());
        p.insert("s3.credentials.secret".to_string(), "SECRET".to_string());
        check_props(&u, &p).unwrap();
        let shown = format!("{:?}", redacted(&p));
        assert!(!shown.contains("SECRET") && shown.contains("AK"), "{shown}");
        p.insert("s3.bogus".to_string(), "1".to_string());
        let e = check_props(&u, &p).unwrap_err().to_string();
        assert!(
            e.contains("s3.bogus") && e.contains("s3.endpoint_url"),
            "{e}"
        );
        p.remove("s3.bogus");
        p.remove("s3.credentials.access");
        assert!(check_props(&u, &p).is_err());
    }
}
