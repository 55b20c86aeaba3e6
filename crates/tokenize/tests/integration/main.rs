//! The integration tests of `kev-tokenize`, one test binary (each module was its own binary; one link instead
//! of many keeps the test build and CI short).

mod fixtures;
mod limits;
mod load_errors;
