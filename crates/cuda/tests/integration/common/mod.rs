//! What the device test files share.

use kev_cuda::Device;

/// Set on a GPU machine (`tools/gpu/check.sh` does) so that a device that does not open fails the tests
/// instead of skipping them.
pub const REQUIRE: &str = "KEV_REQUIRE_CUDA";

/// Whether skipping is refused here.
pub fn required() -> bool {
    std::env::var_os(REQUIRE).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Device 0, or `None` after saying on stderr why the calling test is skipped.
pub fn device() -> Option<Device> {
    match Device::open(0) {
        Ok(d) => {
            eprintln!("device: {}", d.describe());
            Some(d)
        }
        Err(e) if required() => panic!("{REQUIRE} is set and no CUDA device opens: {e}"),
        Err(e) => {
            eprintln!("skipped: no CUDA device here ({e})");
            None
        }
    }
}
