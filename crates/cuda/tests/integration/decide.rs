//! The decision service is generic over the backend and the CUDA backend fits it: this file compiling is
//! the test (`Kev<CudaBackend>` needs `CudaBackend: Backend`, its state size and snapshot grain included).
//! Running decisions on a device is `tests/backend.rs`'s business (skipped without one).

use kev_cuda::backend::CudaBackend;
use kev_decide::{DecideError, Decision, Job, Kev, PointerHead, Settings};
use kev_engine::Backend;
use kev_tokenize::KevTokenizer;

/// Per job, its decision or its error.
type Decisions = Vec<Result<Decision, DecideError>>;

/// Assemble the service over a loaded CUDA backend, as `kev serve --device cuda` would.
fn service(
    backend: CudaBackend,
    head: PointerHead,
    tokenizer: KevTokenizer,
    settings: Settings,
) -> Kev<CudaBackend> {
    Kev::new(backend, head, tokenizer, settings, 0)
}

/// Run admitted jobs through it: the batch path the CLI and the server share.
fn decide(kev: &Kev<CudaBackend>, jobs: &[&Job]) -> Decisions {
    kev.run(jobs)
}

/// A compile-time check: it fails by not building, and has nothing to check at run time.
#[test]
fn kev_over_the_cuda_backend_builds() {
    let _build: fn(CudaBackend, PointerHead, KevTokenizer, Settings) -> Kev<CudaBackend> = service;
    let _run: fn(&Kev<CudaBackend>, &[&Job]) -> Decisions = decide;
    let _grain: fn(&CudaBackend) -> usize = <CudaBackend as Backend>::snapshot_grain;
}
