//! Software prefetch: ask for a cache line before the load that needs it,
//! so that misses on independent addresses overlap (a group of lookups, or
//! the siblings an ordered walk visits next) instead of queueing one after
//! another.

/// Asks for the cache line at `p`; no effect on targets without a stable
/// prefetch instruction, or under Miri.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: a prefetch never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = p;
}
