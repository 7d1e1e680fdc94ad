//! The layered loader: defaults, then the file, `CURVINE_*` environment
//! variables and `-c key=value` (or dedicated flags), each key typed like
//! its default and checked as it is set; `entries` for `conf show`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::error::{ConfError, Source};
use crate::schema::Config;

/// Environment variable naming the config file.
pub const CONF_ENV: &str = "CURVINE_CONF";
/// Prefix of environment variables that set keys.
pub const ENV_PREFIX: &str = "CURVINE_";

/// One key of the effective config with its value and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub key: String,
    pub value: String,
    pub source: Source,
}

/// Builds a [`Config`] from layered sources.
#[derive(Debug, Clone)]
pub struct Loader {
    values: BTreeMap<String, (toml::Value, Source)>,
}

fn flatten(prefix: &str, value: &toml::Value, out: &mut Vec<(String, toml::Value)>) {
    match value {
        toml::Value::Table(table) => {
            for (k, v) in table {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                if v.is_table() {
                    flatten(&key, v, out);
                } else {
                    out.push((key, v.clone()));
                }
            }
        }
        other => out.push((prefix.to_string(), other.clone())),
    }
}

fn display_value(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

impl Default for Loader {
    fn default() -> Self {
        Self::new()
    }
}

impl Loader {
    /// Starts from the defaults.
    pub fn new() -> Loader {
        let mut values = BTreeMap::new();
        let defaults = toml::Value::try_from(Config::default())
            .unwrap_or(toml::Value::Table(Default::default()));
        let mut flat = Vec::new();
        flatten("", &defaults, &mut flat);
        for (k, v) in flat {
            values.insert(k, (v, Source::Default));
        }
        Loader { values }
    }

    /// All keys a config can set.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(|k| k.as_str())
    }

    fn unknown(&self, key: &str, source: Source) -> ConfError {
        let section = key.split('.').next().unwrap_or("");
        let similar: Vec<&str> = self
            .keys()
            .filter(|k| k.starts_with(&format!("{section}.")))
            .collect();
        let hint = if similar.is_empty() {
            format!("; sections are {}", self.sections().join(", "))
        } else {
            format!("; keys of [{section}] are {}", similar.join(", "))
        };
        ConfError::UnknownKey {
            key: key.to_string(),
            origin: source,
            hint,
        }
    }

    fn sections(&self) -> Vec<String> {
        let mut s: Vec<String> = self
            .keys()
            .filter_map(|k| k.split('.').next())
            .map(String::from)
            .collect();
        s.dedup();
        s
    }

    fn set_value(
        &mut self,
        key: &str,
        value: toml::Value,
        source: Source,
    ) -> Result<(), ConfError> {
        let Some((default, _)) = self.values.get(key) else {
            return Err(self.unknown(key, source));
        };
        // Keep the type of the default: a list key given a single string
        // becomes a list, so `--seeds a:1` and `seeds = "a:1"` both work.
        let value = match (default, value) {
            (toml::Value::Array(_), toml::Value::String(s)) => toml::Value::Array(
                s.split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(|p| toml::Value::String(p.into()))
                    .collect(),
            ),
            (_, v) => v,
        };
        self.check_one(key, &value, &source)?;
        self.values.insert(key.to_string(), (value, source));
        Ok(())
    }

    /// Parses a value given as text (environment, `-c`): typed like the key's default.
    fn parse_text(&self, key: &str, text: &str, source: &Source) -> Result<toml::Value, ConfError> {
        let Some((default, _)) = self.values.get(key) else {
            return Err(self.unknown(key, source.clone()));
        };
        let invalid = |allowed: &str| ConfError::InvalidValue {
            key: key.to_string(),
            value: format!("{text:?}"),
            origin: source.clone(),
            allowed: allowed.to_string(),
        };
        Ok(match default {
            toml::Value::Boolean(_) => match text.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => toml::Value::Boolean(true),
                "false" | "0" | "no" | "off" => toml::Value::Boolean(false),
                _ => return Err(invalid("expected true or false")),
            },
            toml::Value::Integer(_) => toml::Value::Integer(
                text.trim()
                    .parse()
                    .map_err(|_| invalid("expected an integer"))?,
            ),
            toml::Value::Float(_) => toml::Value::Float(
                text.trim()
                    .parse()
                    .map_err(|_| invalid("expected a number"))?,
            ),
            toml::Value::Array(_) => toml::Value::Array(
                text.split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(|p| toml::Value::String(p.into()))
                    .collect(),
            ),
            _ => toml::Value::String(text.to_string()),
        })
    }

    /// Checks that a single key's value deserializes, so the error names it.
    fn check_one(&self, key: &str, value: &toml::Value, source: &Source) -> Result<(), ConfError> {
        let mut trial = self.clone();
        trial
            .values
            .insert(key.to_string(), (value.clone(), source.clone()));
        trial
            .build_unchecked()
            .map(|_| ())
            .map_err(|reason| ConfError::InvalidValue {
                key: key.to_string(),
                value: display_value(value),
                origin: source.clone(),
                allowed: reason,
            })
    }

    /// Applies a TOML file.
    pub fn file(&mut self, path: &str) -> Result<&mut Self, ConfError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfError::File {
            path: path.to_string(),
            reason: e.to_string(),
        })?;
        self.toml_text(&text, path)
    }

    /// Applies TOML text read from `origin`.
    pub fn toml_text(&mut self, text: &str, origin: &str) -> Result<&mut Self, ConfError> {
        let value: toml::Value = toml::from_str(text).map_err(|e| ConfError::File {
            path: origin.to_string(),
            reason: e.to_string(),
        })?;
        let mut flat = Vec::new();
        flatten("", &value, &mut flat);
        for (key, v) in flat {
            self.set_value(&key, v, Source::File(origin.to_string()))?;
        }
        Ok(self)
    }

    /// Applies `CURVINE_*` variables from the given environment (except `CURVINE_CONF`).
    pub fn env_vars<I: IntoIterator<Item = (String, String)>>(
        &mut self,
        vars: I,
    ) -> Result<&mut Self, ConfError> {
        let by_env: BTreeMap<String, String> = self
            .keys()
            .map(|k| {
                (
                    format!("{ENV_PREFIX}{}", k.replace('.', "_").to_ascii_uppercase()),
                    k.to_string(),
                )
            })
            .collect();
        for (name, text) in vars {
            if !name.starts_with(ENV_PREFIX) || name == CONF_ENV {
                continue;
            }
            let Some(key) = by_env.get(&name) else {
                return Err(ConfError::UnknownKey {
                    key: name.clone(),
                    origin: Source::Env(name),
                    hint: "; variables are CURVINE_<SECTION>_<KEY>, e.g. CURVINE_NODE_DATA_DIR"
                        .into(),
                });
            };
            let source = Source::Env(name.clone());
            let value = self.parse_text(key, &text, &source)?;
            self.set_value(key, value, source)?;
        }
        Ok(self)
    }

    /// Applies the process environment.
    pub fn env(&mut self) -> Result<&mut Self, ConfError> {
        self.env_vars(std::env::vars())
    }

    /// Applies `key=value` (from `-c`).
    pub fn key_value(&mut self, arg: &str) -> Result<&mut Self, ConfError> {
        let (key, text) = arg.split_once('=').ok_or_else(|| ConfError::NotKeyValue {
            arg: arg.to_string(),
        })?;
        let source = Source::Flag(format!("-c {}", key.trim()));
        let value = self.parse_text(key.trim(), text, &source)?;
        self.set_value(key.trim(), value, source)?;
        Ok(self)
    }

    /// Applies a value given by a dedicated flag (`--data-dir`).
    pub fn flag(&mut self, key: &str, text: &str, flag: &str) -> Result<&mut Self, ConfError> {
        let source = Source::Flag(flag.to_string());
        let value = self.parse_text(key, text, &source)?;
        self.set_value(key, value, source)?;
        Ok(self)
    }

    /// The usual layering for a program: file from `conf_path` or
    /// `CURVINE_CONF`, then the environment, then `-c` arguments. Dedicated
    /// flags are applied by the caller afterwards with [`Loader::flag`].
    pub fn standard(conf_path: Option<&str>, overrides: &[String]) -> Result<Loader, ConfError> {
        let mut loader = Loader::new();
        let from_env = std::env::var(CONF_ENV).ok().filter(|p| !p.is_empty());
        if let Some(path) = conf_path.map(String::from).or(from_env) {
            loader.file(&path)?;
        }
        loader.env()?;
        for kv in overrides {
            loader.key_value(kv)?;
        }
        Ok(loader)
    }

    fn build_unchecked(&self) -> Result<Config, String> {
        let mut root = toml::map::Map::new();
        for (key, (value, _)) in &self.values {
            let mut table = &mut root;
            let parts: Vec<&str> = key.split('.').collect();
            for part in &parts[..parts.len() - 1] {
                table = table
                    .entry(part.to_string())
                    .or_insert_with(|| toml::Value::Table(Default::default()))
                    .as_table_mut()
                    .ok_or_else(|| format!("'{part}' is both a key and a section"))?;
            }
            table.insert(parts[parts.len() - 1].to_string(), value.clone());
        }
        toml::Value::Table(root)
            .try_into::<Config>()
            .map_err(|e| e.message().to_string())
    }

    /// The config, validated.
    pub fn build(&self) -> Result<Config, ConfError> {
        let config = self
            .build_unchecked()
            .map_err(|reason| ConfError::InvalidValue {
                key: "(config)".into(),
                value: String::new(),
                origin: Source::Default,
                allowed: reason,
            })?;
        config.validate(|key| {
            self.values
                .get(key)
                .map(|(_, s)| s.clone())
                .unwrap_or(Source::Default)
        })?;
        Ok(config)
    }

    /// Every key with its effective value and source, in key order.
    pub fn entries(&self) -> Vec<Entry> {
        self.values
            .iter()
            .map(|(key, (value, source))| Entry {
                key: key.clone(),
                value: if (key.ends_with("cookie") || key == "http.token" || key == "s3.secret_key")
                    && value.as_str().is_some_and(|s| !s.is_empty())
                {
                    "\"<redacted>\"".to_string()
                } else {
                    display_value(value)
                },
                source: source.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::ByteSize;

    #[test]
    fn precedence_default_file_env_flag() {
        let mut l = Loader::new();
        l.toml_text(
            "[cluster]\nshards = 8\n[node]\nlisten = \"127.0.0.1:9000\"\n",
            "t.toml",
        )
        .unwrap();
        l.env_vars([("CURVINE_CLUSTER_SHARDS".to_string(), "4".to_string())])
            .unwrap();
        l.key_value("cluster.shards=2").unwrap();
        let c = l.build().unwrap();
        assert_eq!(c.cluster.shards, 2);
        assert_eq!(c.node.listen, "127.0.0.1:9000");
        let entries = l.entries();
        let shards = entries.iter().find(|e| e.key == "cluster.shards").unwrap();
        assert_eq!(shards.source, Source::Flag("-c cluster.shards".into()));
        let listen = entries.iter().find(|e| e.key == "node.listen").unwrap();
        assert_eq!(listen.source, Source::File("t.toml".into()));
        let level = entries.iter().find(|e| e.key == "log.level").unwrap();
        assert_eq!(level.source, Source::Default);
    }

    #[test]
    fn unknown_keys_name_the_key_and_the_choices() {
        let err = Loader::new()
            .key_value("node.lisen=1")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("node.lisen") && err.contains("node.listen"),
            "{err}"
        );
        let err = Loader::new()
            .toml_text("[nodes]\nx = 1\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("nodes.x") && err.contains("f.toml"), "{err}");
        let err = Loader::new()
            .env_vars([("CURVINE_NODE_DATADIR".to_string(), "x".to_string())])
            .unwrap_err()
            .to_string();
        assert!(err.contains("CURVINE_NODE_DATADIR"), "{err}");
    }

    #[test]
    fn bad_values_name_key_value_and_allowed() {
        let err = Loader::new()
            .key_value("meta.map_size=12 parsecs")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("meta.map_size") && err.contains("12 parsecs") && err.contains("size"),
            "{err}"
        );
        let err = Loader::new()
            .key_value("cluster.shards=many")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cluster.shards") && err.contains("integer"),
            "{err}"
        );
        let mut l = Loader::new();
        l.key_value("cluster.shards=1000").unwrap();
        let err = l.build().unwrap_err().to_string();
        assert!(
            err.contains("cluster.shards") && err.contains("1 to 256"),
            "{err}"
        );
        let mut l = Loader::new();
        l.key_value("node.listen=nowhere").unwrap();
        assert!(l.build().unwrap_err().to_string().contains("node.listen"));
        let err = Loader::new()
            .key_value("supervisor.restart_backoff=soon")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("supervisor.restart_backoff") && err.contains("duration"),
            "{err}"
        );
    }

    #[test]
    fn sizes_and_lists_from_text() {
        let mut l = Loader::new();
        l.key_value("meta.map_size=64MiB").unwrap();
        l.flag("node.seeds", "a:1,b:2", "--seeds").unwrap();
        let c = l.build().unwrap();
        assert_eq!(c.meta.map_size, ByteSize(64 << 20));
        assert_eq!(c.node.seeds, vec!["a:1".to_string(), "b:2".to_string()]);
    }
}
