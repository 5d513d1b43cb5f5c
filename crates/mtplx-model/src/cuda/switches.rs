//! The kernel switches: environment variables (`MTPLX_CUDA_ATTEND_MMA`, `..._SPLIT`,
//! `..._TILE`, `MTPLX_CUDA_DECODE_ROUNDED`, `MTPLX_CUDA_DECODE_FUSED`, `MTPLX_CUDA_GRAPHS`)
//! that turn a kernel or a way of launching off, so that one binary can time it against
//! what it replaced (the same bits either way), and a user can step around one that
//! misbehaves on their device; those that turn on one not yet proven on a device
//! (`MTPLX_CUDA_PDL`); and a count a launch may take less of (`MTPLX_CUDA_ATTEND_SPAN`).

/// Whether the switch `name` leaves its kernel on: every switch is on unless set to `0`.
pub(crate) fn switched_on(name: &str) -> bool {
    std::env::var(name).map_or(true, |v| v != "0")
}

/// Whether the switch `name` turns its kernel on: off unless set to `1`.
pub(crate) fn opted_in(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

/// The count the switch `name` sets, within `range`; `default` when it is unset, not a
/// number or outside the range.
pub(crate) fn count(name: &str, default: usize, range: std::ops::RangeInclusive<usize>) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| range.contains(n))
        .unwrap_or(default)
}
