//! Sizes in bytes as flags give them: `80GiB`, `24MiB`, `64GB`, `1048576`.

use crate::error::{Error, Result};

/// Parses `80GiB`, `80G`, `64GB`, `512MiB`, `1e9` into bytes (binary units for `G`/`GiB`/`M`/
/// `MiB`/`K`/`KiB`, decimal for `GB`/`MB`/`KB`). Errors: [`Error::InvalidArgument`].
pub fn parse_bytes(s: &str) -> Result<u64> {
    const MAX_BYTES: u64 = 1 << 60;
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => f64::NAN,
    };
    match num.trim().parse::<f64>() {
        // Above 1 EiB (2^60 bytes) a size is a typo, not a machine: refuse it rather than
        // clamp it silently to u64::MAX.
        Ok(n) if mult.is_finite() && n > 0.0 && n * mult > MAX_BYTES as f64 => {
            Err(Error::InvalidArgument {
                name: "size".into(),
                reason: format!(
                    "`{s}` is {:.3e} bytes, more than 1 EiB; give a size like 80GiB",
                    n * mult
                ),
            })
        }
        Ok(n) if mult.is_finite() && n > 0.0 && n * mult >= 1.0 => Ok((n * mult) as u64),
        _ => Err(Error::InvalidArgument {
            name: "size".into(),
            reason: format!("`{s}` is not a size like 80GiB, 64GB or 512MiB"),
        }),
    }
}

/// A size in bytes as a flag gives it (`24MiB`, `80GiB`, `64GB`, `1048576`): the bytes, and the
/// text as written, which is what `meta.json` records and `--resume` reads back. Equal when
/// the bytes are. Parsed by [`parse_bytes`] (binary units KiB…TiB and their one-letter forms,
/// decimal kB…TB). Serialized as the text; read from a string or a whole number of bytes.
#[derive(Debug, Clone)]
pub struct ByteSize {
    /// Bytes.
    pub bytes: u64,
    text: String,
}

impl ByteSize {
    /// `bytes` as a size, written `<n>MiB` when a whole number of MiB, else in bytes.
    pub fn from_bytes(bytes: u64) -> ByteSize {
        let text = if bytes.is_multiple_of(1 << 20) {
            format!("{}MiB", bytes >> 20)
        } else {
            bytes.to_string()
        };
        ByteSize { bytes, text }
    }
}

impl PartialEq for ByteSize {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl std::str::FromStr for ByteSize {
    type Err = Error;
    /// Errors: as [`parse_bytes`].
    fn from_str(s: &str) -> Result<Self> {
        Ok(ByteSize {
            bytes: parse_bytes(s)?,
            text: s.trim().to_string(),
        })
    }
}

impl std::fmt::Display for ByteSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl serde::Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Form {
            Bytes(u64),
            Text(String),
        }
        let text = match Form::deserialize(d)? {
            Form::Bytes(n) => n.to_string(),
            Form::Text(t) => t,
        };
        text.parse().map_err(serde::de::Error::custom)
    }
}
