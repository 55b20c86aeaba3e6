//! The integration tests of `kev` (crates/cli), one test binary (each module was its own binary; one link instead
//! of many keeps the test build and CI short).

mod calibrate_mini;
mod decide;
mod decide_outputs;
mod ops;
mod prepare_int8;
mod serve_adversity;
mod serve_pins;
mod synthetic_server;
mod tools;
