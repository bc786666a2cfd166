//! The `name[:key=value,...]` parameters of one format or eviction spec, as the grammar
//! ([`super::spec`]) splits them, with the helpers every format and policy file parses with.
//! Errors are plain reasons; the grammar wraps them in [`crate::error::Error::UnknownScheme`]
//! with the whole input and the list of valid schemes.

use std::str::FromStr;

/// The name and `key=value` pairs of one spec part, e.g. `int4:group=64` → (`int4`,
/// [(`group`, `64`)]).
#[derive(Debug, Clone)]
pub struct Params<'a> {
    /// The part's name as written (lower-cased by the grammar), e.g. `int4`.
    pub name: &'a str,
    /// The `key=value` pairs in the order written.
    pub pairs: Vec<(&'a str, &'a str)>,
}

impl Params<'_> {
    /// `Ok` when no parameter was given, else the reason "`name` takes no parameters".
    pub fn none(&self) -> Result<(), String> {
        if self.pairs.is_empty() {
            Ok(())
        } else {
            Err(format!("`{}` takes no parameters", self.name))
        }
    }

    /// Parses `value` of `key` as a number. Error: "`key=value` is not a valid number".
    pub fn num<T: FromStr>(&self, key: &str, value: &str) -> Result<T, String> {
        value
            .parse()
            .map_err(|_| format!("`{key}={value}` is not a valid number"))
    }

    /// The reason for a parameter this part does not take; `allowed` lists the ones it does.
    pub fn unknown(&self, key: &str, allowed: &str) -> String {
        format!(
            "`{}` has no parameter `{key}` (it takes {allowed})",
            self.name
        )
    }
}
