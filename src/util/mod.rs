//! Ground-floor helpers every layer may use and that know nothing about KV caches, models or
//! benchmarks: process memory probes, the UTC clock and run ids, and the one seeded noise
//! generator.

pub mod memory;
pub mod noise;
pub mod time;
