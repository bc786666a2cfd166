//! Quality measurements through the KV cache. Raw per-item metrics only; summaries live in
//! [`crate::stats`] and [`crate::report`].

pub mod generate;
pub mod paired;
pub mod passkey;
pub mod perplexity;
pub mod rouge;
pub mod wikitext;
pub mod xsum;
