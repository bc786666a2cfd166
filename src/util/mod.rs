//! Ground-floor helpers every layer may use and that know nothing about KV caches, models or
//! benchmarks: process memory probes, the UTC clock and run ids, the one seeded noise
//! generator, the run-folder lock and the interrupt handler.

pub mod folder_lock;
pub mod interrupt;
pub mod memory;
pub mod noise;
pub mod time;
