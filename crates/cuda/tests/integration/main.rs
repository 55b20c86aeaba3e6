//! The integration tests of `kev-cuda`, one test binary (each module was its own binary; one link instead
//! of many keeps the test build and CI short).

mod backend;
mod common;
mod decide;
mod device;
