//! The integration tests of `kev-release`, one test binary (each module was its own binary; one link instead
//! of many keeps the test build and CI short).

mod merge_4b;
mod synthetic_release;
