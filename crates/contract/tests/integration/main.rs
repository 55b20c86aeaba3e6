//! The integration tests of `kev-contract`, one test binary (each module was its own binary; one link instead
//! of many keeps the test build and CI short).

mod answers;
mod dates;
mod properties;
mod validation;
mod wire;
