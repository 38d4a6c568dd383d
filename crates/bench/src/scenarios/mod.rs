//! Scenario commands beyond `compare`: the generic fleet run, the latency sweep (b), the connect storm
//! (c), the hot twin (d), memory per twin (e) and node restart time (f).

pub mod common;
pub mod fleet;
pub mod hot;
pub mod memory;
pub mod storm;
pub mod sweep;
