//! [`ShareTarget`]: the layout a view is asked to share its storage with
//! ([`crate::KvView::share_into`]), described without the factory that builds it.

use crate::paged::BlockPool;

/// A layout whose caches can share a view's storage instead of copying its rows.
#[derive(Debug, Clone, Copy)]
pub enum ShareTarget<'a> {
    /// Paged caches of `block_tokens`-position blocks from `pool`.
    Paged {
        block_tokens: usize,
        pool: &'a BlockPool,
    },
    /// Segmented caches whose new segments hold `segment_tokens` positions.
    Segmented { segment_tokens: usize },
}
