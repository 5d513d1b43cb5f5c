//! Content keys: every name on disk and in the manifest is a blake3 digest.

use crate::hex::hex;
use std::fmt;

use crate::identity::IdentityDigest;

/// The on-disk format version. Part of every block key, blob header and manifest record:
/// a new version never reads an old version's data as its own.
pub const FORMAT_VERSION: u32 = 2;

/// Tokens per KV block on disk.
pub const BLOCK_TOKENS: usize = 256;

/// The key of one KV block: blake3 over the format version, the identity digest, the parent
/// block's key (zeros for the first block) and the block's tokens as little-endian u32.
///
/// Chained, so a key names the whole prefix up to the end of its block: two conversations
/// that share the first 512 tokens share their first two block keys, and a block is stored
/// once however many entries reference it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey(pub [u8; 32]);

/// The key of a state blob (a recurrent checkpoint or an entry's tail state): blake3 of its
/// encoded payload.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateKey(pub [u8; 32]);

/// blake3 over the identity digest and every token of an entry: finds an entry whose tokens
/// are exactly a given prefix of a prompt.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenHash(pub [u8; 32]);

impl BlockKey {
    pub const ROOT: BlockKey = BlockKey([0; 32]);

    /// The key of the block holding `tokens` whose parent block is `parent`.
    pub fn chain(identity: &IdentityDigest, parent: &BlockKey, tokens: &[u32]) -> BlockKey {
        let mut h = blake3::Hasher::new_derive_key("mtplx-cold block key");
        h.update(&FORMAT_VERSION.to_le_bytes());
        h.update(&identity.0);
        h.update(&parent.0);
        update_tokens(&mut h, tokens);
        BlockKey(*h.finalize().as_bytes())
    }
}

/// The chained keys of `tokens` cut into [`BLOCK_TOKENS`]-token blocks. The last key covers
/// a partial block when `tokens.len()` is not a multiple of the block size.
pub fn block_keys(identity: &IdentityDigest, tokens: &[u32]) -> Vec<BlockKey> {
    let mut parent = BlockKey::ROOT;
    tokens
        .chunks(BLOCK_TOKENS)
        .map(|chunk| {
            parent = BlockKey::chain(identity, &parent, chunk);
            parent
        })
        .collect()
}

/// How many blocks `tokens` positions take (the last one maybe partial).
pub fn blocks_for(tokens: usize) -> usize {
    tokens.div_ceil(BLOCK_TOKENS)
}

/// The keys of the full blocks only (what a prompt can share with a stored entry).
pub fn full_block_keys(identity: &IdentityDigest, tokens: &[u32]) -> Vec<BlockKey> {
    let full = tokens.len() / BLOCK_TOKENS * BLOCK_TOKENS;
    block_keys(identity, &tokens[..full])
}

impl StateKey {
    pub fn of(payload: &[u8]) -> StateKey {
        StateKey(blake3::derive_key("mtplx-cold state", payload))
    }
}

/// Hashes every prefix of a token sequence whose length is asked for, in one pass.
pub(crate) struct TokenHasher {
    hasher: blake3::Hasher,
    fed: usize,
}

impl TokenHasher {
    pub(crate) fn new(identity: &IdentityDigest) -> TokenHasher {
        let mut hasher = blake3::Hasher::new_derive_key("mtplx-cold token hash");
        hasher.update(&identity.0);
        TokenHasher { hasher, fed: 0 }
    }

    /// The hash of `tokens[..len]`; `len` must not decrease between calls.
    pub(crate) fn prefix(&mut self, tokens: &[u32], len: usize) -> TokenHash {
        update_tokens(&mut self.hasher, &tokens[self.fed..len]);
        self.fed = len;
        TokenHash(*self.hasher.finalize().as_bytes())
    }
}

impl TokenHash {
    pub fn of(identity: &IdentityDigest, tokens: &[u32]) -> TokenHash {
        TokenHasher::new(identity).prefix(tokens, tokens.len())
    }
}

fn update_tokens(h: &mut blake3::Hasher, tokens: &[u32]) {
    let mut buf = [0u8; 4 * 256];
    for chunk in tokens.chunks(256) {
        for (dst, t) in buf.chunks_exact_mut(4).zip(chunk) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        h.update(&buf[..chunk.len() * 4]);
    }
}

macro_rules! debug_hex {
    ($($t:ident),*) => {$(
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($t), "({})"), hex(&self.0[..8]))
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&hex(&self.0))
            }
        }
    )*};
}
debug_hex!(BlockKey, StateKey, TokenHash);

#[cfg(test)]
mod tests {
    use super::*;

    const ID: IdentityDigest = IdentityDigest([7; 32]);

    #[test]
    fn shared_prefix_shares_keys_and_divergence_changes_the_rest() {
        let a: Vec<u32> = (0..700).collect();
        let mut b = a.clone();
        b[600] = 99_999;
        let (ka, kb) = (block_keys(&ID, &a), block_keys(&ID, &b));
        assert_eq!(ka.len(), 3);
        assert_eq!(ka[..2], kb[..2]);
        assert_ne!(ka[2], kb[2]);
        // Chained: the same block tokens after a different parent give a different key.
        let mut c = a.clone();
        c[0] = 5;
        assert_ne!(block_keys(&ID, &c)[1], ka[1]);
        assert_ne!(block_keys(&IdentityDigest([8; 32]), &a)[0], ka[0]);
        assert_eq!(full_block_keys(&ID, &a).len(), 2);
    }

    #[test]
    fn keys_are_pinned() {
        // A change here orphans every stored entry: bump FORMAT_VERSION instead. (The block
        // key changed with version 2, which it hashes; the token hash does not hash it.)
        let tokens: Vec<u32> = (0..300).collect();
        let keys = block_keys(&ID, &tokens);
        assert_eq!(keys[0].to_string(), PINNED_BLOCK0);
        assert_eq!(TokenHash::of(&ID, &tokens).to_string(), PINNED_TOKEN_HASH);
    }
    const PINNED_BLOCK0: &str = "c7142af33dd1be2a6320d92f83f53a4f3b6ff60846e936a4ce663bd24f98af6d";
    const PINNED_TOKEN_HASH: &str =
        "f9fddf51a2639a7223f4a0b4345a170836a583f015b7417845479b1fbd00de8b";

    #[test]
    fn token_hasher_matches_one_shot_hash_at_every_length() {
        let tokens: Vec<u32> = (0..1000).map(|i| i * 7919).collect();
        let mut h = TokenHasher::new(&ID);
        for len in [0, 1, 255, 256, 257, 999, 1000] {
            assert_eq!(h.prefix(&tokens, len), TokenHash::of(&ID, &tokens[..len]));
        }
    }
}
