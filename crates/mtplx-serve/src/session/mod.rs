//! Conversations by name: the id a client gave (or the server made), where it came from,
//! how it appears in logs, and the locks that run one session's jobs one at a time.

pub mod locks;

/// Longest session id accepted; longer ones are hashed down to this.
pub const MAX_ID_LEN: usize = 128;

/// Where a request's session id came from (the request log's `session_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionSource {
    Header,
    MetadataSessionId,
    MetadataConversationId,
    MetadataUserId,
    User,
    /// The longest token-prefix match against known sessions.
    PrefixMatch,
    /// Nothing matched: a new `anon-…` session.
    Anonymous,
}

impl SessionSource {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionSource::Header => "header",
            SessionSource::MetadataSessionId => "metadata.session_id",
            SessionSource::MetadataConversationId => "metadata.conversation_id",
            SessionSource::MetadataUserId => "metadata.user_id",
            SessionSource::User => "user",
            SessionSource::PrefixMatch => "prefix_match",
            SessionSource::Anonymous => "anonymous",
        }
    }
}

/// A client-named session id, trimmed, non-empty, printable ASCII, at most
/// [`MAX_ID_LEN`] bytes (longer or non-ASCII ids are replaced by a blake3 digest, so any
/// string names a stable session without putting arbitrary bytes in logs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionHint {
    id: String,
    source: SessionSource,
}

impl SessionHint {
    /// `None` for an empty (or all-whitespace) id.
    pub fn new(raw: &str, source: SessionSource) -> Option<SessionHint> {
        let raw = raw.trim();
        if raw.is_empty() {
            return None;
        }
        let plain = raw.len() <= MAX_ID_LEN && raw.bytes().all(|b| b.is_ascii_graphic());
        let id = if plain {
            raw.to_owned()
        } else {
            format!("h-{}", &blake3::hash(raw.as_bytes()).to_hex()[..32])
        };
        Some(SessionHint { id, source })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn source(&self) -> SessionSource {
        self.source
    }
}

/// How a session id appears in logs: the first 16 hex digits of its blake3 (ids are
/// client text, never logged as such).
pub fn session_hash(id: &str) -> String {
    blake3::hash(id.as_bytes()).to_hex()[..16].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_ids_become_stable_digests() {
        let long = "x".repeat(500);
        let a = SessionHint::new(&long, SessionSource::User).unwrap();
        let b = SessionHint::new(&long, SessionSource::User).unwrap();
        assert_eq!(a, b);
        assert!(a.id().starts_with("h-") && a.id().len() == 34);
        let spaced = SessionHint::new("my chat", SessionSource::User).unwrap();
        assert_ne!(spaced.id(), "my chat");
        assert_eq!(
            SessionHint::new(" ok-1 ", SessionSource::Header)
                .unwrap()
                .id(),
            "ok-1"
        );
        assert!(SessionHint::new("", SessionSource::Header).is_none());
    }
}
