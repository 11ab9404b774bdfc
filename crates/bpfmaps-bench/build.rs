//! Records the compiler version for the report's machine section: asking
//! the `rustc` that builds us is exact and costs nothing at run time.
//!
//! Probes for the native (C) libraries of the native peers, each from a
//! Debian package (see `src/native/mod.rs`): a library found is linked and
//! its peer compiled in (`cfg(native_NAME)`); one missing is skipped, and
//! `BPFMAPS_BENCH_NATIVE` tells the report which is which. Setting
//! `BPFMAPS_BENCH_NO_NATIVE` to `1` (or `all`) skips them all, to a
//! comma-separated list of names skips those.

use std::path::Path;
use std::process::Command;

/// How a native library is found.
enum Probe {
    /// Its package ships a pkg-config file: the module's name
    /// (`libdpdk`); pkg-config also gives the link flags.
    #[expect(
        dead_code,
        reason = "for the first native library whose package ships a .pc file (DPDK's libdpdk)"
    )]
    PkgConfig(&'static str),
    /// No pkg-config file: a C program that includes `header` and runs
    /// `code` must compile and link with `-l` each of `libs`.
    Compile {
        header: &'static str,
        libs: &'static [&'static str],
        code: &'static str,
    },
}

/// A native library a peer links.
struct Native {
    /// Short name: the cfg is `native_{name}`, the report's line says it.
    name: &'static str,
    /// The Debian package that ships it (headers and library).
    package: &'static str,
    probe: Probe,
    /// Functions the Rust side defines for the library to call instead of
    /// its own (Judy's allocator hooks), exported from the binary so that
    /// the shared library's calls reach them.
    exports: &'static [&'static str],
}

/// Every native library, one entry each. `.ci/run` installs the packages
/// named here (it reads the `package: "..."` lines).
const NATIVE: &[Native] = &[
    Native {
        name: "judy",
        package: "libjudy-dev",
        probe: Probe::Compile {
            header: "Judy.h",
            libs: &["Judy"],
            code: "Pvoid_t a = (Pvoid_t) NULL; JudyHSFreeArray(&a, PJE0);",
        },
        exports: &[
            "JudyMalloc",
            "JudyFree",
            "JudyMallocVirtual",
            "JudyFreeVirtual",
        ],
    },
    // Its .pc file names no library (`Libs: -L${libdir}` only), so it is
    // probed by compiling rather than through pkg-config.
    Native {
        name: "hat_trie",
        package: "libhat-trie-dev",
        probe: Probe::Compile {
            header: "hat-trie/hat-trie.h",
            libs: &["hat-trie"],
            code: "hattrie_free(hattrie_create());",
        },
        exports: &[],
    },
];

/// What became of one library.
enum Found {
    Built,
    Missing,
    Disabled,
}

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=BENCH_RUSTC_VERSION={version}");
    println!("cargo:rerun-if-env-changed=RUSTC");

    native();
}

/// Probes every library of [`NATIVE`]; emits its cfg and link flags when
/// found, and `BPFMAPS_BENCH_NATIVE=name,package,state;...` (state:
/// `built`, `missing` or `disabled`) for the report.
fn native() {
    println!("cargo:rerun-if-env-changed=BPFMAPS_BENCH_NO_NATIVE");
    // Installing or removing a Debian package rewrites dpkg's status file:
    // probe again then, so a package installed after a first build is
    // picked up (and one removed is no longer linked).
    let dpkg_status = Path::new("/var/lib/dpkg/status");
    if dpkg_status.exists() {
        println!("cargo:rerun-if-changed={}", dpkg_status.display());
    }
    let skip = std::env::var("BPFMAPS_BENCH_NO_NATIVE").unwrap_or_default();
    let skip: Vec<&str> = skip.split(',').map(str::trim).collect();
    let mut states = Vec::new();
    for lib in NATIVE {
        println!("cargo::rustc-check-cfg=cfg(native_{})", lib.name);
        let found = if skip
            .iter()
            .any(|s| *s == "1" || *s == "all" || *s == lib.name)
        {
            Found::Disabled
        } else if probe(lib) {
            println!("cargo:rustc-cfg=native_{}", lib.name);
            for f in lib.exports {
                println!("cargo:rustc-link-arg=-Wl,--export-dynamic-symbol={f}");
            }
            Found::Built
        } else {
            println!(
                "cargo:warning=native peer {} skipped: {} is not installed (apt-get install {})",
                lib.name, lib.package, lib.package
            );
            Found::Missing
        };
        let state = match found {
            Found::Built => "built",
            Found::Missing => "missing",
            Found::Disabled => "disabled",
        };
        states.push(format!("{},{},{state}", lib.name, lib.package));
    }
    println!("cargo:rustc-env=BPFMAPS_BENCH_NATIVE={}", states.join(";"));
}

/// Whether `lib` is there; when it is, its link flags are emitted.
fn probe(lib: &Native) -> bool {
    match lib.probe {
        Probe::PkgConfig(module) => pkg_config::Config::new().probe(module).is_ok(),
        Probe::Compile { header, libs, code } => {
            if !compiles(lib.name, header, libs, code) {
                return false;
            }
            for l in libs {
                println!("cargo:rustc-link-lib={l}");
            }
            true
        }
    }
}

/// Whether a C program including `header` and running `code` compiles and
/// links against `libs` with the target's C compiler (`cc` crate: `CC`,
/// `CFLAGS` and cross-compilation as usual). Nothing is run.
fn compiles(name: &str, header: &str, libs: &[&str], code: &str) -> bool {
    let out = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join(format!("probe-{name}"));
    let src = out.with_extension("c");
    let program = format!("#include <{header}>\nint main(void) {{ {code} return 0; }}\n");
    if std::fs::write(&src, program).is_err() {
        return false;
    }
    let Ok(compiler) = cc::Build::new()
        .cargo_warnings(false)
        .warnings(false)
        .try_get_compiler()
    else {
        return false;
    };
    let mut cmd = compiler.to_command();
    cmd.arg(&src).arg("-o").arg(&out);
    for l in libs {
        cmd.arg(format!("-l{l}"));
    }
    cmd.output().is_ok_and(|o| o.status.success())
}
