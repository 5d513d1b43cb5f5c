//! mtplx-spec: speculative decoding.
//!
//! Its job (issue 7): proposers (an MTP head, prompt lookup, a draft model) draft k tokens;
//! the model verifies them in one forward pass; greedy and sampled acceptance keep the
//! output exactly the model's own; rollback trims the KV to the accepted length.
//!
//! It must not know HTTP, sessions or the SSD tier.
//!
//! Not built yet: this crate is an empty placeholder in the workspace until issue 7 lands.
