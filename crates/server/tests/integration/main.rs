//! The integration tests of `kev-server`, one test binary (each module was its own binary; one link instead
//! of many keeps the test build and CI short).

mod adversity;
mod adversity3;
mod http;
mod keys;
mod openapi;
mod ops;
mod routes;
mod support;
mod tools;
