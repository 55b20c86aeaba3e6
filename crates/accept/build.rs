//! Embeds the shipped acceptance request set (`fixtures/accept/requests/*.json`) and the Python reference
//! script (`tools/reference/reference_arm.py` + `kevref/*.py`) into the library, so a release binary runs
//! `kev accept` away from the repository.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn list(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == ext))
        .collect();
    out.sort();
    out
}

fn table(name: &str, files: &[(String, PathBuf)]) -> String {
    let mut s = format!("pub(crate) const {name}: &[(&str, &[u8])] = &[\n");
    for (key, path) in files {
        let _ = writeln!(
            s,
            "    ({key:?}, include_bytes!({:?})),",
            path.display().to_string()
        );
    }
    s.push_str("];\n");
    s
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest.join("../..");
    let requests = root.join("fixtures/accept/requests");
    let reference = root.join("tools/reference");
    println!("cargo:rerun-if-changed={}", requests.display());
    println!(
        "cargo:rerun-if-changed={}",
        reference.join("reference_arm.py").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        reference.join("kevref").display()
    );

    let set: Vec<(String, PathBuf)> = list(&requests, "json")
        .into_iter()
        .map(|p| {
            let stem = p
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            (stem, p.canonicalize().unwrap_or(p))
        })
        .collect();
    let mut scripts = vec![(
        "reference_arm.py".to_string(),
        reference.join("reference_arm.py"),
    )];
    for p in list(&reference.join("kevref"), "py") {
        let name = format!(
            "kevref/{}",
            p.file_name().unwrap_or_default().to_string_lossy()
        );
        scripts.push((name, p));
    }
    for (_, p) in &scripts {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let scripts: Vec<(String, PathBuf)> = scripts
        .into_iter()
        .map(|(n, p)| (n, p.canonicalize().unwrap_or(p)))
        .collect();
    let mut code = String::new();
    code.push_str(&table("REQUEST_SET", &set));
    code.push_str(&table("REFERENCE_SCRIPTS", &scripts));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join("embedded.rs");
    std::fs::write(&out, code).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
}
