//! The integration tests of `kev-decide`, one test binary (each module was its own binary; one link instead
//! of many keeps the test build and CI short).

mod adapters;
mod adversity;
mod extensions;
mod int8_dev;
mod live_adapters;
mod mini;
mod parity;
mod shape_9b;
mod support;
mod untied;
