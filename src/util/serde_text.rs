//! A value kept in JSON as its text (`Display` out, `FromStr` in): for settings whose flag and
//! suite form is a string (`--slo ttft=2000,tpot=250`) while the type is structured.
//! Use as `#[serde(with = "crate::util::serde_text")]`.

use std::fmt::Display;
use std::str::FromStr;

/// Writes `v`'s `Display` text.
pub fn serialize<T: Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// Reads a string and parses it with `FromStr`. Errors: serde's, with the parser's message.
pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
where
    T: FromStr,
    T::Err: Display,
    D: serde::Deserializer<'de>,
{
    let s = <String as serde::Deserialize>::deserialize(d)?;
    s.parse().map_err(serde::de::Error::custom)
}
