//! Admin routes: the session bank and the SSD tier, for operators. Behind the API key when
//! one is set (the auth layer covers every route but `/health`).

use http::Response;
use serde_json::json;

use super::json_response;
use crate::body::Body;
use crate::cache::SsdMode;
use crate::error::ApiError;
use crate::state::AppState;

/// `GET /admin/sessions`: the sessions the bank holds, most recently used first.
pub fn sessions(state: &AppState) -> Response<Body> {
    let bank = state.tier().bank();
    let data: Vec<_> = bank
        .sessions()
        .into_iter()
        .map(|s| {
            json!({
                "id": s.id.as_str(),
                "entries": s.entries,
                "bytes": s.bytes,
                "longest_tokens": s.longest_tokens,
                "idle_s": s.idle_for.as_secs_f64(),
            })
        })
        .collect();
    let stats = bank.stats();
    json_response(&json!({
        "object": "list",
        "data": data,
        "bank": {
            "bytes": stats.bytes,
            "entries": stats.entries,
            "max_bytes": bank.config().max_bytes,
            "max_entries": bank.config().max_entries,
            "hits": stats.hits(),
            "restores": stats.restores.iter().map(|(m, n)| (m.to_string(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
            "misses": stats.misses,
            "busy_sessions": state.tier().locks().busy(),
        },
    }))
}

/// `POST /admin/cache/clear`: forgets every bank entry (the SSD tier is kept).
pub fn clear(state: &AppState) -> Response<Body> {
    let cleared = state.tier().bank().clear();
    json_response(&json!({ "cleared_entries": cleared }))
}

/// `POST /admin/sessions/{id}/clear`: forgets one session's entries.
pub fn clear_session(state: &AppState, id: &str) -> Result<Response<Body>, ApiError> {
    let cleared = state
        .tier()
        .bank()
        .clear_session(&mtplx_bank::SessionId::new(id));
    Ok(json_response(
        &json!({ "session": id, "cleared_entries": cleared }),
    ))
}

/// `GET /admin/cache/ssd`: the SSD tier's mode, place and usage.
pub fn ssd(state: &AppState) -> Result<Response<Body>, ApiError> {
    let tier = state.tier();
    let mode = match tier.ssd_mode() {
        SsdMode::Off => "off",
        SsdMode::On => "on",
        SsdMode::WriteOnly => "write-only",
    };
    let Some(cold) = tier.cold() else {
        return Ok(json_response(&json!({ "mode": mode })));
    };
    let usage = cold
        .usage()
        .map_err(|e| ApiError::internal(format!("reading the SSD tier's manifest: {e}")))?;
    Ok(json_response(&json!({
        "mode": mode,
        "dir": tier.ssd_dir().display().to_string(),
        "entries": usage.entries,
        "used_bytes": usage.used_bytes,
        "cap_bytes": cold.config().cap_bytes,
        "backlog_bytes": cold.backlog_bytes(),
    })))
}
