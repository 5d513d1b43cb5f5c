//! mtplx-bank: the RAM session bank.
//!
//! Its job (issue 5): keep committed conversation states (KV snapshots, what is needed to
//! continue decoding, recurrent checkpoints) keyed by their exact tokens and identity; answer
//! a prompt with the candidate that covers the most prompt tokens, from every source (RAM
//! and, through the `ColdIndex` trait, the SSD tier) before any tensor is decoded; restore
//! through the caller's cache factory; evict and admit within budgets.
//!
//! It must not know HTTP, tokio, or how the SSD tier lays out its files.
//!
//! Not built yet: this crate is an empty placeholder in the workspace until issue 5 lands.
