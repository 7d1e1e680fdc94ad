//! Sizes (`128KB`, `64MiB`) and durations (`30s`, `10m`) as config values.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

/// A size in bytes. Accepts an integer (bytes) or a string with a unit:
/// `B`, `KB`/`KiB`/`K`, `MB`/`MiB`/`M`, `GB`/`GiB`/`G`, `TB`/`TiB`/`T`, all
/// powers of 1024 (as storage tools print them), case-insensitive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn as_u64(self) -> u64 {
        self.0
    }

    pub fn parse(text: &str) -> Result<ByteSize, String> {
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        if number.is_empty() {
            return Err(format!(
                "'{text}' is not a size (expected e.g. 128KB, 64MiB, 4096)"
            ));
        }
        let value: f64 = number
            .parse()
            .map_err(|_| format!("'{text}' is not a size (expected e.g. 128KB, 64MiB, 4096)"))?;
        let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            "t" | "tb" | "tib" => 1 << 40,
            other => {
                return Err(format!(
                    "unknown size unit '{other}' in '{text}' (use B, KB, MB, GB, TB)"
                ))
            }
        };
        let bytes = value * factor as f64;
        if !bytes.is_finite() || bytes > u64::MAX as f64 {
            return Err(format!("size '{text}' is too large"));
        }
        Ok(ByteSize(bytes as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        for (name, size) in UNITS {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{}", self.0 / size, name);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) if n >= 0 => Ok(ByteSize(n as u64)),
            Raw::Int(n) => Err(serde::de::Error::custom(format!("size {n} is negative"))),
            Raw::Text(t) => ByteSize::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// A duration. Accepts a string with a unit (`250ms`, `30s`, `10m`, `2h`,
/// `1d`) or an integer number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dur(pub Duration);

impl Dur {
    pub fn as_duration(self) -> Duration {
        self.0
    }

    pub fn parse(text: &str) -> Result<Dur, String> {
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("'{text}' is not a duration (expected e.g. 250ms, 30s, 10m)"))?;
        let seconds = match unit.trim() {
            "" | "s" => value,
            "ms" => value / 1000.0,
            "us" => value / 1_000_000.0,
            "m" | "min" => value * 60.0,
            "h" => value * 3600.0,
            "d" => value * 86400.0,
            other => {
                return Err(format!(
                    "unknown duration unit '{other}' in '{text}' (use ms, s, m, h, d)"
                ))
            }
        };
        Duration::try_from_secs_f64(seconds)
            .map(Dur)
            .map_err(|_| format!("duration '{text}' is out of range"))
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms == 0 && !self.0.is_zero() {
            return write!(f, "{}us", self.0.as_micros());
        }
        if !ms.is_multiple_of(1000) {
            return write!(f, "{ms}ms");
        }
        let s = ms / 1000;
        if s != 0 && s.is_multiple_of(3600) {
            write!(f, "{}h", s / 3600)
        } else if s != 0 && s.is_multiple_of(60) {
            write!(f, "{}m", s / 60)
        } else {
            write!(f, "{s}s")
        }
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) if n >= 0 => Ok(Dur(Duration::from_secs(n as u64))),
            Raw::Int(n) => Err(serde::de::Error::custom(format!(
                "duration {n} is negative"
            ))),
            Raw::Text(t) => Dur::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(ByteSize::parse("128KB").unwrap().0, 128 * 1024);
        assert_eq!(ByteSize::parse("64MiB").unwrap().0, 64 << 20);
        assert_eq!(ByteSize::parse("1.5g").unwrap().0, 3 << 29);
        assert_eq!(ByteSize::parse("4096").unwrap().0, 4096);
        assert!(ByteSize::parse("12 parsecs").is_err());
        assert!(ByteSize::parse("MB").is_err());
        assert_eq!(ByteSize(64 << 20).to_string(), "64MiB");
        assert_eq!(ByteSize(1000).to_string(), "1000B");
    }

    #[test]
    fn durations() {
        assert_eq!(Dur::parse("30s").unwrap().0, Duration::from_secs(30));
        assert_eq!(Dur::parse("10m").unwrap().0, Duration::from_secs(600));
        assert_eq!(Dur::parse("250ms").unwrap().0, Duration::from_millis(250));
        assert!(Dur::parse("soon").is_err());
        assert!(Dur::parse("3 fortnights").is_err());
        assert_eq!(Dur(Duration::from_secs(600)).to_string(), "10m");
        assert_eq!(Dur(Duration::from_millis(1500)).to_string(), "1500ms");
    }
}
