//! The C tests (`tests/c/*.c`): each compiled with the system's C
//! compiler against `include/` and this crate's static library, then run
//! (under valgrind's memcheck when `BPFMAPS_VALGRIND=1`, as CI does: any
//! invalid access or leak fails the test).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/<profile>`, where cargo put the static library beside this
/// test's binary (`target/<profile>/deps/`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The static library, `libbpfmaps.a` (package `bpfmaps-c`): `cargo
/// test` builds only the rlib this test links, so this runs `cargo build`
/// for the C library once, in the same target directory and profile.
fn static_lib() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = profile_dir();
            let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            cmd.args(["build", "--quiet", "-p", "bpfmaps-c"])
                .current_dir(crate_dir())
                .env("CARGO_TARGET_DIR", dir.parent().unwrap());
            if dir.file_name().unwrap() == "release" {
                cmd.arg("--release");
            }
            let status = cmd.status().expect("runs cargo");
            assert!(status.success(), "cargo build of the static library");
            dir.join("libbpfmaps.a")
        })
        .clone()
}

/// Compiles `tests/c/<name>.c` and returns the program's path.
fn build(name: &str, extra: &[&str]) -> PathBuf {
    let lib = static_lib();
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("c-{name}"));
    let src = crate_dir().join(format!("tests/c/{name}.c"));
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(crate_dir().join("include"))
        .args(extra)
        .arg(&src)
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&out)
        .status()
        .expect("a C compiler (cc)");
    assert!(status.success(), "compiling {}", src.display());
    out
}

/// Runs a built program, under valgrind if asked.
fn run(program: &Path) {
    let valgrind = std::env::var_os("BPFMAPS_VALGRIND").is_some_and(|v| v == "1");
    let mut cmd = if valgrind {
        let mut c = Command::new("valgrind");
        c.args([
            "--error-exitcode=99",
            // Valgrind runs one thread at a time; by default a thread that
            // spins keeps the turn, and a run of `threads.c` once hung
            // for 15 minutes with its readers spinning while the main
            // thread waited inside `pthread_create` for the writer. Fair
            // scheduling hands the turn round in order.
            "--fair-sched=yes",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect",
            "--quiet",
        ]);
        c.arg(program);
        c
    } else {
        Command::new(program)
    };
    let out = cmd.output().expect("runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "{} failed ({}):\n{text}",
        program.display(),
        out.status
    );
}

#[test]
fn every_call_and_errno() {
    run(&build("calls", &[]));
}

#[test]
fn readers_writers_and_a_close_under_readers() {
    run(&build("threads", &[]));
}

#[test]
fn a_libbpf_program_builds_through_the_compat_header() {
    run(&build("compat", &[]));
}

/// Needs libbpf's header (Debian's `libbpf-dev`, which `.ci/run`
/// installs); says so and passes without it.
#[test]
fn signatures_and_layouts_are_libbpfs() {
    if !Path::new("/usr/include/bpf/bpf.h").exists() {
        eprintln!("no <bpf/bpf.h> (libbpf-dev): signatures not compared");
        return;
    }
    run(&build("libbpf_signatures", &[]));
}

/// `install.sh` puts the libraries, headers and `bpfmaps.pc` under a
/// prefix; a program built with pkg-config's flags links the shared
/// library and runs.
#[test]
fn installs_with_a_pkg_config_file() {
    let lib_dir = static_lib().parent().unwrap().to_path_buf();
    let prefix = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("prefix");
    let status = Command::new(crate_dir().join("install.sh"))
        .arg(&prefix)
        .env("BPFMAPS_LIB_DIR", &lib_dir)
        .status()
        .expect("runs install.sh");
    assert!(status.success(), "install.sh");
    let pc_path = prefix.join("lib/pkgconfig");
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "bpfmaps"])
        .env("PKG_CONFIG_PATH", &pc_path)
        .output();
    let Ok(flags) = flags else {
        eprintln!("no pkg-config: the installed .pc file not tried");
        return;
    };
    assert!(flags.status.success(), "pkg-config finds bpfmaps");
    let flags = String::from_utf8(flags.stdout).unwrap();
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("c-installed");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror"])
        .arg(crate_dir().join("tests/c/compat.c"))
        .args(flags.split_whitespace())
        .arg("-o")
        .arg(&out)
        .status()
        .expect("a C compiler (cc)");
    assert!(status.success(), "compiling against the installed library");
    let run = Command::new(&out)
        .env("LD_LIBRARY_PATH", prefix.join("lib"))
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let ldd = Command::new("ldd").arg(&out).output();
    if let Ok(ldd) = ldd {
        let text = String::from_utf8_lossy(&ldd.stdout).into_owned();
        assert!(
            text.contains("libbpfmaps.so"),
            "linked the shared library: {text}"
        );
    }
}
