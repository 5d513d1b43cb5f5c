//! Who may reuse a stored state: the model, its chat template, MTP on/off, the policy and
//! the element type of its K/V rows.

use std::fmt;

use crate::dtype::KvDtype;

/// Whether the model's MTP head is part of the stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mtp {
    Off,
    On,
}

/// The identity a stored state belongs to. A state is never offered under another identity:
/// every key on disk is derived from [`Identity::digest`].
///
/// The fields are opaque to this crate: the caller decides what a model id or a policy
/// fingerprint is (a checkpoint hash, a quantisation name, a sampler-independent policy
/// string…). Two identities are equal exactly when their digests are.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    pub model: String,
    pub chat_template: String,
    pub mtp: Mtp,
    pub policy: String,
    /// The element type the server keeps K/V rows in: rows stored as one type are never
    /// offered to a server keeping another (their keys differ).
    pub kv_dtype: KvDtype,
}

/// The blake3 digest of an [`Identity`]: stable across builds and platforms.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdentityDigest(pub [u8; 32]);

impl Identity {
    /// blake3 over a domain string and each field, strings length-prefixed (u64
    /// little-endian) so no two different identities share an encoding; the K/V element
    /// type last, as its on-disk code.
    pub fn digest(&self) -> IdentityDigest {
        let mut h = blake3::Hasher::new_derive_key("mtplx-cold identity v1");
        for field in [self.model.as_bytes(), self.chat_template.as_bytes()] {
            h.update(&(field.len() as u64).to_le_bytes());
            h.update(field);
        }
        h.update(&[match self.mtp {
            Mtp::Off => 0,
            Mtp::On => 1,
        }]);
        h.update(&(self.policy.len() as u64).to_le_bytes());
        h.update(self.policy.as_bytes());
        h.update(&[self.kv_dtype.code()]);
        IdentityDigest(*h.finalize().as_bytes())
    }
}

impl fmt::Debug for IdentityDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdentityDigest({})", crate::hex::hex(&self.0[..8]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(model: &str, template: &str, mtp: Mtp, policy: &str) -> Identity {
        Identity {
            model: model.into(),
            chat_template: template.into(),
            mtp,
            policy: policy.into(),
            kv_dtype: KvDtype::F32,
        }
    }

    #[test]
    fn every_field_changes_the_digest() {
        let base = id("m", "t", Mtp::Off, "p").digest();
        assert_ne!(base, id("m2", "t", Mtp::Off, "p").digest());
        assert_ne!(base, id("m", "t2", Mtp::Off, "p").digest());
        assert_ne!(base, id("m", "t", Mtp::On, "p").digest());
        assert_ne!(base, id("m", "t", Mtp::Off, "p2").digest());
        // Each element type its own digest, so its keys never collide with another's.
        let dtypes: std::collections::HashSet<IdentityDigest> = KvDtype::ALL
            .iter()
            .map(|&kv_dtype| {
                Identity {
                    kv_dtype,
                    ..id("m", "t", Mtp::Off, "p")
                }
                .digest()
            })
            .collect();
        assert_eq!(dtypes.len(), KvDtype::ALL.len());
        assert!(dtypes.contains(&base));
        // Length prefixes: moving bytes between fields is a different identity.
        assert_ne!(
            id("ab", "c", Mtp::Off, "").digest(),
            id("a", "bc", Mtp::Off, "").digest()
        );
    }

    #[test]
    fn digest_is_stable_across_builds() {
        // Pinned: a change here orphans every stored entry and needs a format bump.
        // Changed with format version 2, which hashes the K/V element type (`kv_dtype`,
        // f32 here) after the policy.
        let d = id("smollm2-135m", "tmpl", Mtp::On, "default").digest();
        assert_eq!(
            crate::hex::hex(&d.0),
            "84e656baa51285ec082a8d6dbc7b15f7057a5046d3c699725025dcb3e1c59445"
        );
    }
}
