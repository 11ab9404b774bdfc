//! Errors that mirror the kernel's errno values, so C and Python front ends
//! can map them one to one.

use std::borrow::Cow;

/// Why a map operation failed. Each variant maps to one kernel errno.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// `ENOENT`: no such key (or iteration reached its end).
    #[error("no such key")]
    NotFound,
    /// `EEXIST`: the key exists and `BPF_NOEXIST` was asked for.
    #[error("key already exists")]
    Exists,
    /// `E2BIG`: the map holds `max_entries` entries.
    #[error("map is full")]
    Full,
    /// `EINVAL`: a bad argument; the message says which.
    #[error("invalid argument: {0}")]
    Invalid(Cow<'static, str>),
    /// `ENOMEM`: an allocation failed.
    #[error("out of memory")]
    NoMemory,
    /// `EBUSY`: the operation cannot run now (e.g. a concurrent conflict).
    #[error("resource busy")]
    Busy,
    /// `EOPNOTSUPP`: this map type does not support the operation.
    #[error("operation not supported by this map")]
    Unsupported,
}

impl Error {
    /// The kernel errno (positive) for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => 2,     // ENOENT
            Error::Exists => 17,      // EEXIST
            Error::Full => 7,         // E2BIG
            Error::Invalid(_) => 22,  // EINVAL
            Error::NoMemory => 12,    // ENOMEM
            Error::Busy => 16,        // EBUSY
            Error::Unsupported => 95, // EOPNOTSUPP
        }
    }

    /// An `EINVAL` with a message saying what is wrong.
    pub fn invalid(msg: impl Into<Cow<'static, str>>) -> Self {
        Error::Invalid(msg.into())
    }
}

/// Result of a map operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Checks that a caller's buffer has the size the map was created with.
/// Inlined: it runs on every operation, and the error is the rare path.
#[inline(always)]
pub(crate) fn check_len(what: &'static str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(len_error(what, got, want))
    }
}

#[cold]
#[inline(never)]
fn len_error(what: &'static str, got: usize, want: usize) -> Error {
    Error::Invalid(Cow::Owned(format!(
        "{what} is {got} bytes, the map expects {want}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_values_match_linux() {
        assert_eq!(Error::NotFound.errno(), 2);
        assert_eq!(Error::Exists.errno(), 17);
        assert_eq!(Error::Full.errno(), 7);
        assert_eq!(Error::invalid("x").errno(), 22);
        assert_eq!(Error::NoMemory.errno(), 12);
        assert_eq!(Error::Busy.errno(), 16);
        assert_eq!(Error::Unsupported.errno(), 95);
    }

    #[test]
    fn check_len_says_what_is_wrong() {
        assert!(check_len("key", 4, 4).is_ok());
        let err = check_len("key", 3, 4).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid argument: key is 3 bytes, the map expects 4"
        );
    }
}
