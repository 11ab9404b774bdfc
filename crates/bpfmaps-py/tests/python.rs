//! The Python package's tests (`tests/test_*.py`, pytest with
//! hypothesis), driven from `cargo test`: a virtual environment under
//! `target/py-venv` with maturin, numpy, pytest and hypothesis from PyPI,
//! the package built into it by `maturin develop --release`, then pytest.
//! `BPFMAPS_PYTHON_TESTS=0` skips it (saying so) where no Python 3 or no
//! package registry is at hand; CI runs it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command, what: &str) {
    let status = cmd.status().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(status.success(), "{what} failed ({status})");
}

/// The venv's directory: `target/py-venv`, beside the profile directories.
fn venv() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap(); // target/<profile>/deps/<exe>
    target.join("py-venv")
}

#[test]
fn pytest_passes() {
    if std::env::var_os("BPFMAPS_PYTHON_TESTS").is_some_and(|v| v == "0") {
        eprintln!("BPFMAPS_PYTHON_TESTS=0: the Python tests skipped");
        return;
    }
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = venv();
    let python = venv.join("bin/python");
    if !python.exists() {
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv",
        );
    }
    run(
        Command::new(&python).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "maturin>=1.5,<2",
            "numpy>=1.21",
            "pytest>=7",
            "hypothesis>=6",
        ]),
        "pip install (maturin, numpy, pytest, hypothesis)",
    );
    // The same target directory: maturin's cargo shares what this build
    // already compiled.
    let target = venv.parent().unwrap();
    run(
        Command::new(venv.join("bin/maturin"))
            .args(["develop", "--release", "--quiet", "--manifest-path"])
            .arg(crate_dir.join("Cargo.toml"))
            .env("VIRTUAL_ENV", &venv)
            .env("CARGO_TARGET_DIR", target),
        "maturin develop",
    );
    run(
        Command::new(&python)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(crate_dir.join("tests"))
            .arg("--doctest-modules")
            .arg(crate_dir.join("python/bpfmaps_rs"))
            .current_dir(crate_dir),
        "pytest",
    );
}
