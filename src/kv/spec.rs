//! KV-cache scheme specs: the strings `--dtypes` takes and the CSV prints — only the grammar
//! that composes formats and policies; each format's and policy's own `name[:k=v,…]` is parsed
//! and printed by its file ([`super::formats`], [`super::evict`]).
//!
//! Grammar (whitespace-free):
//!
//! ```text
//! scheme  := [evict '@'] store ['+rot']         e.g. window:size=1024@int8, q4_0+rot
//! store   := quant | quant '/' quant            K and V formats, e.g. int4-channel/int4
//! evict   := a policy of kv::evict              h2o[:budget=N|ratio=r,recent=M] | window[:…]
//! quant   := a format of kv::formats            fp16 | int8-token | int4[:group=G] | …
//! ```
//!
//! A lone policy stores fp16; a lone key-only format (per-channel) implies its value partner
//! (KIVI's pairing: keys per-channel, values per-token at the same bit width).

use std::fmt;
use std::str::FromStr;

use super::evict::Eviction;
use super::formats::Quant;
use super::params::Params;
use super::scheme::KvScheme;
use crate::error::{Error, Result};

pub use super::evict::h2o::{Budget, DEFAULT_H2O_RATIO, DEFAULT_H2O_RECENT};
pub use super::evict::window::{DEFAULT_SINKS, DEFAULT_WINDOW};
pub use super::formats::channel::{DEFAULT_CHANNEL_GROUP, DEFAULT_RESIDUAL};
pub use super::formats::fp8::{Fp8Kind, Fp8Scale};
pub use super::formats::int4::DEFAULT_INT4_GROUP;

/// How schemes compose, after the list of formats and policies in [`VALID_SCHEMES`].
const COMPOSE: &str =
    "; compose as EVICT@K/V+rot, e.g. window:size=1024@int8, int4-channel/int4, q4_0+rot";

/// Every accepted spec, for error messages and `--help`: each registered format's and policy's
/// help entry (from its file), then how they compose.
pub const VALID_SCHEMES: &str = {
    const PARTS: [&[&str]; 2] = [super::formats::HELP, super::evict::HELP];
    const LEN: usize = joined_len(&PARTS) + COMPOSE.len();
    const BYTES: [u8; LEN] = join::<LEN>(&PARTS, COMPOSE);
    match std::str::from_utf8(&BYTES) {
        Ok(s) => s,
        Err(_) => panic!("help entries are UTF-8"),
    }
};

/// Length of every entry of `parts` joined with ", ".
const fn joined_len(parts: &[&[&str]]) -> usize {
    let (mut n, mut count, mut i) = (0, 0, 0);
    while i < parts.len() {
        let mut j = 0;
        while j < parts[i].len() {
            n += parts[i][j].len();
            count += 1;
            j += 1;
        }
        i += 1;
    }
    n + 2 * (count - 1)
}

/// Every entry of `parts` joined with ", ", then `tail` (N is the total length).
const fn join<const N: usize>(parts: &[&[&str]], tail: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let (mut at, mut i, mut first) = (0, 0, true);
    while i < parts.len() {
        let mut j = 0;
        while j < parts[i].len() {
            if !first {
                out[at] = b',';
                out[at + 1] = b' ';
                at += 2;
            }
            first = false;
            let s = parts[i][j].as_bytes();
            let mut k = 0;
            while k < s.len() {
                out[at] = s[k];
                at += 1;
                k += 1;
            }
            j += 1;
        }
        i += 1;
    }
    let s = tail.as_bytes();
    let mut k = 0;
    while k < s.len() {
        out[at] = s[k];
        at += 1;
        k += 1;
    }
    out
}

impl fmt::Display for KvScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(e) = self.evict {
            write!(f, "{e}")?;
        }
        let implied_pair = self.k.per_channel() && self.v == self.k.value_partner();
        let store = if self.k == self.v || implied_pair {
            self.k.to_string()
        } else {
            format!("{}/{}", self.k, self.v)
        };
        match (self.evict.is_some(), store.as_str()) {
            (true, "fp16") => {}
            (true, s) => write!(f, "@{s}")?,
            (false, s) => write!(f, "{s}")?,
        }
        if self.rotate {
            write!(f, "+rot")?;
        }
        Ok(())
    }
}

struct Parser<'a> {
    input: &'a str,
}

impl Parser<'_> {
    fn err(&self, reason: impl Into<String>) -> Error {
        Error::UnknownScheme {
            input: self.input.to_string(),
            reason: reason.into(),
            valid: VALID_SCHEMES.to_string(),
        }
    }

    /// `name[:k=v,...]` → its [`Params`].
    fn split<'s>(&self, s: &'s str) -> Result<Params<'s>> {
        let (name, params) = match s.split_once(':') {
            Some((n, p)) => (n, p),
            None => (s, ""),
        };
        let pairs = params
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|kv| {
                kv.split_once('=')
                    .ok_or_else(|| self.err(format!("parameter `{kv}` is not key=value")))
            })
            .collect::<Result<_>>()?;
        Ok(Params { name, pairs })
    }

    fn quant(&self, s: &str) -> Result<Quant> {
        let p = self.split(s)?;
        if p.name.is_empty() {
            return Err(self.err("empty scheme"));
        }
        match Quant::parse(&p) {
            Ok(Some(q)) => Ok(q),
            Ok(None) => Err(self.err(format!("no scheme is called `{}`", p.name))),
            Err(reason) => Err(self.err(reason)),
        }
    }

    fn eviction(&self, s: &str) -> Result<Option<Eviction>> {
        Eviction::parse(&self.split(s)?).map_err(|reason| self.err(reason))
    }

    fn scheme(&self) -> Result<KvScheme> {
        let mut s = self.input.trim().to_ascii_lowercase();
        let rotate = s.ends_with("+rot");
        if rotate {
            s.truncate(s.len() - 4);
        }
        let (evict, store) = match s.split_once('@') {
            Some((e, st)) => match self.eviction(e)? {
                Some(ev) => (Some(ev), st.to_string()),
                None => {
                    let names: Vec<&str> = super::evict::PARSERS
                        .iter()
                        .flat_map(|(n, _)| n.iter().copied())
                        .collect();
                    return Err(self.err(format!(
                        "`{e}` before `@` is not {}",
                        names.join(" or ")
                    )));
                }
            },
            None => match self.eviction(&s)? {
                Some(ev) => (Some(ev), "fp16".to_string()),
                None => (None, s.clone()),
            },
        };
        let (k, v) = match store.split_once('/') {
            Some((k, v)) => {
                let (k, v) = (self.quant(k)?, self.quant(v)?);
                if v.per_channel() {
                    return Err(self.err(
                        "per-channel quantization is for keys (KIVI §3.2); give values a per-token \
                         format, e.g. int4-channel/int4",
                    ));
                }
                (k, v)
            }
            None => {
                let k = self.quant(&store)?;
                (k, k.value_partner())
            }
        };
        if evict.is_some() && k.per_channel() {
            return Err(self.err(
                "eviction cannot be combined with per-channel keys (evicting single tokens breaks \
                 their token groups); use a per-token format under eviction",
            ));
        }
        Ok(KvScheme {
            evict,
            k,
            v,
            rotate,
        })
    }
}

impl FromStr for KvScheme {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Parser { input: s }.scheme()
    }
}

impl serde::Serialize for KvScheme {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for KvScheme {
    /// Parses the spec string, with the same error text as `--dtypes`.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Splits a `--dtypes` list: commas separate schemes, except before `key=value` parameters of
/// the previous scheme (`int8-channel:group=32,residual=64,fp16` → two schemes).
pub fn split_scheme_list(list: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in list.split(',') {
        let is_param = part.contains('=') && !part.contains(':') && !part.contains('@');
        match out.last_mut() {
            Some(prev) if is_param => {
                prev.push(',');
                prev.push_str(part);
            }
            _ => out.push(part.to_string()),
        }
    }
    out.into_iter().filter(|s| !s.trim().is_empty()).collect()
}

/// Parses a `--dtypes` list. Errors: [`Error::UnknownScheme`] for the first bad entry.
pub fn parse_scheme_list(list: &str) -> Result<Vec<KvScheme>> {
    split_scheme_list(list).iter().map(|s| s.parse()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every registered format and policy is listed in the help (by its first name), and the
    /// list reads as written by hand.
    #[test]
    fn valid_schemes_lists_every_registered_name() {
        let firsts = super::super::formats::PARSERS
            .iter()
            .map(|(n, _)| n[0])
            .chain(super::super::evict::PARSERS.iter().map(|(n, _)| n[0]));
        for name in firsts {
            assert!(VALID_SCHEMES.contains(name), "{name} missing from {VALID_SCHEMES}");
        }
        assert_eq!(
            VALID_SCHEMES,
            "fp16, int8-token (alias int8), int4[:group=G], int8-channel[:group=G,residual=R], \
             int4-channel[:group=G,residual=R], fp8[:scale=token|head|tensor|none], \
             fp8-e5m2[:scale=...], q8_0, q4_0, h2o[:budget=N|ratio=r,recent=M], \
             window[:size=W,sinks=S]; compose as EVICT@K/V+rot, e.g. window:size=1024@int8, \
             int4-channel/int4, q4_0+rot"
        );
    }

    #[test]
    fn specs_round_trip_through_display() {
        for s in [
            "fp16",
            "int8-token",
            "int4",
            "int4:group=64",
            "int8-channel",
            "int8-channel:group=16,residual=64",
            "fp8",
            "fp8:scale=head",
            "fp8-e5m2:scale=tensor",
            "fp8:scale=none",
            "q8_0",
            "q4_0+rot",
            "h2o:ratio=0.2,recent=32",
            "h2o:budget=128,recent=16@int8-token",
            "window:size=1024,sinks=4@q8_0/q4_0",
            "int4-channel/q4_0+rot",
        ] {
            let k: KvScheme = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(k.to_string(), s, "display of {s}");
            assert_eq!(k.to_string().parse::<KvScheme>().unwrap(), k);
        }
        assert_eq!(
            "int8".parse::<KvScheme>().unwrap().to_string(),
            "int8-token"
        );
        assert_eq!(
            "h2o".parse::<KvScheme>().unwrap().to_string(),
            "h2o:ratio=0.2,recent=32"
        );
        assert_eq!(
            "window".parse::<KvScheme>().unwrap().to_string(),
            "window:size=256,sinks=4"
        );
        // KIVI's pairing prints as the channel spec alone.
        assert_eq!(
            "int4-channel/int4".parse::<KvScheme>().unwrap().to_string(),
            "int4-channel"
        );
        let kivi: KvScheme = "int8-channel".parse().unwrap();
        assert_eq!(kivi.v, Quant::Int8Token);
    }

    #[test]
    fn nonsense_is_rejected_with_the_valid_list() {
        for bad in [
            "int3",
            "int4:group=7",
            "int4:size=32",
            "fp16:group=2",
            "fp8:scale=row",
            "h2o:budget=8,recent=16",
            "window:size=64@int8-channel",
            "int8/int4-channel",
            "foo@int8",
            "h2o:ratio=1.5",
        ] {
            let e = bad.parse::<KvScheme>().unwrap_err().to_string();
            assert!(e.contains("valid schemes"), "{bad}: {e}");
        }
    }

    #[test]
    fn list_splitting_keeps_parameters_with_their_scheme() {
        assert_eq!(
            split_scheme_list("fp16,int8-channel:group=16,residual=64,h2o:budget=64,recent=8,int4"),
            vec![
                "fp16",
                "int8-channel:group=16,residual=64",
                "h2o:budget=64,recent=8",
                "int4"
            ]
        );
    }
}
