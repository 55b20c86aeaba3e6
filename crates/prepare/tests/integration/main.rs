//! The integration tests of `kev-prepare`, one test binary (each module was its own binary; one link instead
//! of many keeps the test build and CI short).

mod download;
mod prepare_local;
