//! One module per subcommand; each exposes `Args` and `run(Args) -> anyhow::Result<ExitCode>`.

pub mod accept;
pub mod bench;
pub mod calibrate;
pub mod decide;
pub mod eval;
pub mod labelled;
pub mod prepare;
pub mod rows;
pub mod serve;
pub mod synth;
pub mod verify;
