//! The units of a sweep's work and the subset one process runs: the types the sweep runner
//! ([`super::sweep`], [`super::synthetic`]) and the shard planner ([`super::shard`]) share, in
//! a module of their own so neither imports the other's.

use std::fmt;

use crate::kv::KvScheme;

/// One unit of a sweep's work.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "unit", rename_all = "snake_case")]
pub enum Unit {
    /// A timing point: warm-up and timed repeats of `batch` × `seq_len` with K/V in `scheme`.
    Timing {
        /// KV scheme.
        scheme: KvScheme,
        /// Sequences decoded together.
        batch: usize,
        /// Prompt tokens per sequence.
        seq_len: usize,
    },
    /// A scheme's quality work: perplexity (with the fp16 cache in lockstep when KL is on),
    /// XSum summaries, passkey trials.
    Quality {
        /// KV scheme.
        scheme: KvScheme,
    },
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unit::Timing {
                scheme,
                batch,
                seq_len,
            } => write!(f, "{scheme} batch {batch} × {seq_len} tokens"),
            Unit::Quality { scheme } => write!(f, "{scheme} quality"),
        }
    }
}

/// The units one process runs: all of them (no sharding) or one shard's. The sweep runners
/// skip every unit not in here.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    units: Vec<Unit>,
}

impl Selection {
    /// Runs exactly `units`.
    pub fn new(units: Vec<Unit>) -> Self {
        Selection { units }
    }

    /// The units, in planned order.
    pub fn units(&self) -> &[Unit] {
        &self.units
    }

    /// Whether the timing point `scheme` × `batch` × `seq_len` is selected.
    pub fn has_timing(&self, scheme: KvScheme, batch: usize, seq_len: usize) -> bool {
        self.units.contains(&Unit::Timing {
            scheme,
            batch,
            seq_len,
        })
    }

    /// Whether `scheme`'s quality unit is selected.
    pub fn has_quality(&self, scheme: KvScheme) -> bool {
        self.units.contains(&Unit::Quality { scheme })
    }

    /// Selected timing points of `scheme`.
    pub fn timing_points(&self, scheme: KvScheme) -> usize {
        self.units
            .iter()
            .filter(|u| matches!(u, Unit::Timing { scheme: s, .. } if *s == scheme))
            .count()
    }
}
