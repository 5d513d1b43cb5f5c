//! Fields every generation endpoint accepts besides its own: `generation_mode`, and the
//! body's hints of which conversation a request continues (`metadata.session_id`,
//! `metadata.conversation_id`, Anthropic's `metadata.user_id`, the `user` field).

use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;
use crate::job::GenerationMode;
use crate::session::{SessionHint, SessionSource};

/// Flattened into each endpoint's request type.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RequestExtras {
    /// `"mtp"` (speculative, the default) or `"ar"` (one token per forward pass).
    pub generation_mode: Option<String>,
    pub metadata: Option<Value>,
    pub user: Option<String>,
}

impl RequestExtras {
    /// The requested mode; anything but `mtp` / `ar` is a 400.
    pub fn mode(&self) -> Result<GenerationMode, ApiError> {
        match self.generation_mode.as_deref() {
            None | Some("mtp") => Ok(GenerationMode::Mtp),
            Some("ar") => Ok(GenerationMode::Ar),
            Some(other) => Err(ApiError::invalid_param(
                "generation_mode",
                format!("`generation_mode` must be \"mtp\" or \"ar\", got {other:?}."),
            )),
        }
    }

    /// The session the body names, first that applies: `metadata.session_id`,
    /// `metadata.conversation_id`, `metadata.user_id` (Anthropic), then `user`.
    pub fn session(&self) -> Option<SessionHint> {
        let meta = |key: &str| {
            self.metadata
                .as_ref()
                .and_then(|m| m.get(key))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let found = [
            ("session_id", SessionSource::MetadataSessionId),
            ("conversation_id", SessionSource::MetadataConversationId),
            ("user_id", SessionSource::MetadataUserId),
        ]
        .into_iter()
        .find_map(|(key, source)| meta(key).map(|id| (id, source)))
        .or_else(|| self.user.clone().map(|u| (u, SessionSource::User)))?;
        SessionHint::new(&found.0, found.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn extras(v: Value) -> RequestExtras {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn modes_are_mtp_by_default_and_checked() {
        assert_eq!(extras(json!({})).mode().unwrap(), GenerationMode::Mtp);
        let ar = extras(json!({"generation_mode": "ar"}));
        assert_eq!(ar.mode().unwrap(), GenerationMode::Ar);
        let bad = extras(json!({"generation_mode": "fast"}))
            .mode()
            .unwrap_err();
        assert_eq!(bad.status, http::StatusCode::BAD_REQUEST);
        assert!(bad.message.contains("generation_mode"), "{bad}");
    }

    #[test]
    fn body_sessions_take_metadata_before_user() {
        let s = extras(json!({"metadata": {"conversation_id": "c1"}, "user": "u"}));
        let hint = s.session().unwrap();
        assert_eq!(
            (hint.id(), hint.source()),
            ("c1", SessionSource::MetadataConversationId)
        );
        let s = extras(json!({"metadata": {"session_id": "s", "conversation_id": "c"}}));
        assert_eq!(s.session().unwrap().id(), "s");
        let s = extras(json!({"user": "alice", "metadata": {"other": 1}}));
        assert_eq!(s.session().unwrap().source(), SessionSource::User);
        assert!(extras(json!({"metadata": {"session_id": 7}}))
            .session()
            .is_none());
        assert!(extras(json!({"user": ""})).session().is_none());
    }
}
