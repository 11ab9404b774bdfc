//! Update flags and map-creation flags, with the kernel's values.

use super::error::{Error, Result};

/// `BPF_ANY`: create a new element or update an existing one.
pub const BPF_ANY: u64 = 0;
/// `BPF_NOEXIST`: create a new element only if it does not exist.
pub const BPF_NOEXIST: u64 = 1;
/// `BPF_EXIST`: update an existing element only.
pub const BPF_EXIST: u64 = 2;

/// `BPF_F_NO_PREALLOC`: allocate elements on demand instead of up front.
pub const BPF_F_NO_PREALLOC: u32 = 1 << 0;
/// `BPF_F_ZERO_SEED`: hash with seed 0 instead of a random seed (for tests
/// and reproducible benchmarks).
pub const BPF_F_ZERO_SEED: u32 = 1 << 6;

/// `BPF_F_FAST_STACK_CMP`: stack trace map compares stacks by hash only.
pub const BPF_F_FAST_STACK_CMP: u64 = 1 << 9;
/// `BPF_F_REUSE_STACKID`: stack trace map replaces a colliding stack.
pub const BPF_F_REUSE_STACKID: u64 = 1 << 10;

/// What an update may do with respect to an existing key: the decoded form
/// of `BPF_ANY` / `BPF_NOEXIST` / `BPF_EXIST`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateFlag {
    /// `BPF_ANY`.
    Any,
    /// `BPF_NOEXIST`.
    NoExist,
    /// `BPF_EXIST`.
    Exist,
}

impl UpdateFlag {
    /// Decodes update flags; unknown bits are `EINVAL`, as in the kernel.
    pub fn from_bits(flags: u64) -> Result<Self> {
        match flags {
            BPF_ANY => Ok(UpdateFlag::Any),
            BPF_NOEXIST => Ok(UpdateFlag::NoExist),
            BPF_EXIST => Ok(UpdateFlag::Exist),
            _ => Err(Error::invalid(format!(
                "update flags {flags:#x}: expected BPF_ANY (0), BPF_NOEXIST (1) or BPF_EXIST (2)"
            ))),
        }
    }

    /// The flag's `BPF_*` value.
    pub fn bits(self) -> u64 {
        match self {
            UpdateFlag::Any => BPF_ANY,
            UpdateFlag::NoExist => BPF_NOEXIST,
            UpdateFlag::Exist => BPF_EXIST,
        }
    }

    /// Checks the flag against whether the key is present: the kernel's
    /// `check_flags()`.
    #[inline]
    pub fn check(self, exists: bool) -> Result<()> {
        match (self, exists) {
            (UpdateFlag::NoExist, true) => Err(Error::Exists),
            (UpdateFlag::Exist, false) => Err(Error::NotFound),
            _ => Ok(()),
        }
    }
}

/// Rejects creation flags outside `allowed`.
pub(crate) fn check_map_flags(flags: u32, allowed: u32) -> Result<()> {
    if flags & !allowed == 0 {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "map flags {:#x} not supported by this map type",
            flags & !allowed
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_known_flags_and_rejects_the_rest() {
        assert_eq!(UpdateFlag::from_bits(0).unwrap(), UpdateFlag::Any);
        assert_eq!(UpdateFlag::from_bits(1).unwrap(), UpdateFlag::NoExist);
        assert_eq!(UpdateFlag::from_bits(2).unwrap(), UpdateFlag::Exist);
        for bad in [3, 4, 8, 1 << 40, u64::MAX] {
            assert_eq!(UpdateFlag::from_bits(bad).unwrap_err().errno(), 22);
        }
    }

    #[test]
    fn check_matches_kernel_semantics() {
        assert!(UpdateFlag::Any.check(true).is_ok());
        assert!(UpdateFlag::Any.check(false).is_ok());
        assert_eq!(UpdateFlag::NoExist.check(true), Err(Error::Exists));
        assert!(UpdateFlag::NoExist.check(false).is_ok());
        assert!(UpdateFlag::Exist.check(true).is_ok());
        assert_eq!(UpdateFlag::Exist.check(false), Err(Error::NotFound));
    }

    #[test]
    fn map_flags_outside_allowed_are_invalid() {
        assert!(check_map_flags(BPF_F_NO_PREALLOC, BPF_F_NO_PREALLOC | BPF_F_ZERO_SEED).is_ok());
        assert!(check_map_flags(1 << 3, BPF_F_NO_PREALLOC).is_err());
    }
}
