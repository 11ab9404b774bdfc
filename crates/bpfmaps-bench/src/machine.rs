//! What the numbers were measured on: CPU, core count, kernel, compiler,
//! the native peers built in, date. Read from `/proc` and the build;
//! nothing is run.

use std::time::{SystemTime, UNIX_EPOCH};

/// A description of the machine and build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// Cores available to this process (`nproc`).
    pub nproc: usize,
    /// `model name` from `/proc/cpuinfo`.
    pub cpu_model: String,
    /// `/proc/sys/kernel/osrelease`.
    pub kernel: String,
    /// `rustc --version` of the compiler that built this binary.
    pub rustc: String,
    /// Whether this is an optimised build (debug numbers are meaningless).
    pub optimized: bool,
    /// The native (C) peers and whether each was built in
    /// ([`crate::native::summary`]).
    pub native: String,
    /// UTC date and time, `YYYY-MM-DD HH:MM:SS UTC`.
    pub date: String,
}

impl Machine {
    /// Gathers the description now.
    pub fn detect() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: cpu_model(&cpuinfo).unwrap_or_else(|| "unknown".into()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
            rustc: env!("BENCH_RUSTC_VERSION").to_string(),
            optimized: !cfg!(debug_assertions),
            native: crate::native::summary(),
            date: utc_now(),
        }
    }

    /// Markdown table rows.
    pub fn to_markdown(&self) -> String {
        let build = if self.optimized {
            "optimised (release profile)"
        } else {
            "**debug build: numbers are not meaningful**"
        };
        format!(
            "| | |\n| --- | --- |\n| CPU | {} |\n| nproc | {} |\n| kernel | {} |\n| rustc | {} |\n| build | {} |\n| native peers | {} |\n| allocator | {}, wrapped by a counting allocator (one relaxed atomic add per alloc/free) |\n| date | {} |\n",
            self.cpu_model,
            self.nproc,
            self.kernel,
            self.rustc,
            build,
            self.native,
            crate::alloc::UNDER,
            self.date
        )
    }
}

/// The first `model name` in a `/proc/cpuinfo` text.
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == "model name")
        .map(|(_, v)| v.trim().to_string())
}

/// The current UTC time as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_utc(secs)
}

/// Formats Unix seconds as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn format_utc(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
    }

    #[test]
    fn reads_the_cpu_model() {
        let info = "processor\t: 0\nvendor_id\t: X\nmodel name\t: Some CPU @ 3.0GHz\n";
        assert_eq!(cpu_model(info).as_deref(), Some("Some CPU @ 3.0GHz"));
        assert_eq!(cpu_model(""), None);
    }
}
