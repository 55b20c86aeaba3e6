//! The integration tests of `kev-engine`, one test binary (each module was its own binary; one link instead
//! of many keeps the test build and CI short).

mod engine;
mod fixtures;
mod int8_hidden;
mod loader;
mod shape_0_8b;
