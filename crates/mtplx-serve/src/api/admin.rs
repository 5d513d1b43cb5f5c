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
                "checkpoints": s.checkpoints,
                "checkpoint_bytes": s.checkpoint_bytes,
                "idle_s": s.idle_for.as_secs_f64(),
            })
        })
        .collect();
    let stats = bank.stats();
    json_response(&json!({
        "object": "list",
        "data": data,
        "bank": {
            "kv_dtype": state.tier().factory().dtype().as_str(),
            "kv_layout": format!("{:?}", state.tier().factory().layout()).to_lowercase(),
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

/// `GET /admin/cache/ssd`: the SSD tier's mode, place, usage and room (the cap in force is
/// re-read from the free disk at each call), and what the bank's writes to it did.
pub fn ssd(state: &AppState) -> Result<Response<Body>, ApiError> {
    let tier = state.tier();
    let mode = match tier.ssd_mode() {
        SsdMode::Off => "off",
        SsdMode::On => "on",
        SsdMode::WriteOnly => "write-only",
    };
    let kv_dtype = tier.factory().dtype().as_str();
    let Some(status) = tier.bank().ssd_status() else {
        return Ok(json_response(
            &json!({ "mode": mode, "kv_dtype": kv_dtype }),
        ));
    };
    let status = status.map_err(|e| ApiError::internal(e.to_string()))?;
    let (space, writes) = (&status.space, &status.writes);
    let bank = tier.bank().stats();
    Ok(json_response(&json!({
        "mode": mode,
        "kv_dtype": kv_dtype,
        "dir": status.dir.display().to_string(),
        "entries": space.usage.entries,
        "used_bytes": space.usage.used_bytes,
        "cap_bytes": space.cap_bytes,
        "configured_cap_bytes": space.configured_cap_bytes,
        "free_bytes": space.free_bytes,
        "free_disk_floor_bytes": space.free_disk_floor,
        "backlog_bytes": status.backlog_bytes,
        "written_last_hour_bytes": writes.written_last_hour,
        "skipped_over_write_budget": writes.skipped_over_budget,
        "bank": {
            "spilling_entries": bank.spilling,
            "unwritten_entries": bank.unwritten,
            "writes_queued": bank.spills_queued,
            "writes_committed": bank.spills_written,
            "writes_failed": bank.spills_failed,
            "failures_by_reason": bank.spill_failures,
            "entries_lost": bank.entries_lost,
        },
    })))
}
