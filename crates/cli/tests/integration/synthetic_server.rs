//! `kev serve` on the synthetic release (`fixtures/release`) on a free loopback port, for the end-to-end server
//! tests: killed when dropped, its log drained so it never blocks on a full pipe.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn release() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/release"
    ))
}

pub struct Server {
    child: Child,
    pub base: String,
    pub port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kev serve --base … --kev … --host 127.0.0.1 --port P EXTRA…`, once `/ready` answers 200.
pub fn serve(extra: &[&str]) -> Server {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let r = release();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kev"))
        .env("KEV_LOG", "warn")
        .env_remove("KEV_API_KEY")
        .arg("serve")
        .arg("--base")
        .arg(r.join("base"))
        .arg("--kev")
        .arg(r.join("kev"))
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting kev serve");
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || for _ in BufReader::new(err).lines() {});
    let s = Server {
        child,
        base: format!("http://127.0.0.1:{port}"),
        port,
    };
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(120) {
        if let Ok(r) = ureq::get(&format!("{}/ready", s.base)).call()
            && r.status() == 200
        {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("kev serve never became ready");
}
