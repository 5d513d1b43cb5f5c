//! Who an entry belongs to.

use std::fmt;

/// A conversation's id, as the server resolved it (a header, a body field, or an
/// `anon-…` id). Entries belong to a session; budgets and eviction are per session.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub String);

impl SessionId {
    /// A session id from anything string-like.
    pub fn new(id: impl Into<String>) -> Self {
        SessionId(id.into())
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for SessionId {
    fn from(s: &str) -> Self {
        SessionId(s.to_string())
    }
}
