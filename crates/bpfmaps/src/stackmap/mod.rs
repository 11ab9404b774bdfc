//! `BPF_MAP_TYPE_STACK_TRACE` (in progress).
use crate::core::contract::MapSpec;
use crate::core::error::{Error, Result};

/// Stack trace map.
pub struct StackTraceMap;

impl StackTraceMap {
    /// Builds from a `create()` spec.
    pub fn from_spec(_spec: &MapSpec) -> Result<std::convert::Infallible> {
        Err(Error::Unsupported)
    }
}
