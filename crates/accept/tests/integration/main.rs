//! The integration tests of `kev-accept`, one test binary (each module was its own binary; one link instead
//! of many keeps the test build and CI short).

mod synthetic;
