//! `GET /v1/models`, `GET /v1/models/{id}`, `GET /health`, `GET /metrics`.

use http::Response;
use serde_json::{json, Value};

use super::{json_response, text_response};
use crate::body::Body;
use crate::error::ApiError;
use crate::metrics::{write_scalar, Family, Kind};
use crate::state::AppState;

fn model_json(state: &AppState) -> Value {
    json!({
        "id": state.model_id(),
        "object": "model",
        "created": state.started(),
        "owned_by": "mtplx",
        "context_window": state.context_window(),
    })
}

pub fn list(state: &AppState) -> Response<Body> {
    json_response(&json!({ "object": "list", "data": [model_json(state)] }))
}

pub fn get(state: &AppState, id: &str) -> Result<Response<Body>, ApiError> {
    super::check_model(state, Some(id))?;
    Ok(json_response(&model_json(state)))
}

pub fn health(state: &AppState) -> Response<Body> {
    json_response(&json!({
        "status": "ok",
        "model": state.model_id(),
        "context_window": state.context_window(),
    }))
}

pub fn metrics(state: &AppState) -> Response<Body> {
    let mut text = state.metrics().render();
    write_scalar(
        &mut text,
        Kind::Gauge,
        "mtplx_active_requests",
        "Generation requests in flight.",
        state.active_requests() as u64,
    );
    let tier = state.tier();
    let bank = tier.bank().stats();
    let mut gauges = vec![
        (
            "mtplx_bank_bytes",
            "Bytes held by the RAM session bank.",
            bank.bytes,
        ),
        (
            "mtplx_bank_entries",
            "Entries in the RAM session bank.",
            bank.entries as u64,
        ),
        (
            "mtplx_bank_sessions",
            "Sessions in the RAM session bank.",
            bank.sessions as u64,
        ),
        (
            "mtplx_memory_reserved_bytes",
            "Memory reserved by admitted requests.",
            tier.reserved(),
        ),
    ];
    gauges.push((
        "mtplx_bank_checkpoint_bytes",
        "Bytes of hybrid models' recurrent checkpoints in the RAM session bank (part of mtplx_bank_bytes).",
        bank.checkpoint_bytes,
    ));
    gauges.push((
        "mtplx_bank_spilling_entries",
        "Evicted bank entries whose write to the SSD tier has not committed (still served from RAM).",
        bank.spilling as u64,
    ));
    gauges.push((
        "mtplx_bank_unwritten_entries",
        "Bank entries not on the SSD tier yet.",
        bank.unwritten as u64,
    ));
    if let Some(space) = tier
        .bank()
        .ssd_status()
        .and_then(Result::ok)
        .map(|s| s.space)
    {
        gauges.push((
            "mtplx_ssd_bytes",
            "Bytes of blobs in the SSD tier.",
            space.usage.used_bytes,
        ));
        gauges.push((
            "mtplx_ssd_entries",
            "Entries in the SSD tier.",
            space.usage.entries,
        ));
        gauges.push((
            "mtplx_ssd_cap_bytes",
            "The SSD tier's cap in force: the configured one or a quarter of the disk it may use, whichever is smaller.",
            space.cap_bytes,
        ));
        gauges.push((
            "mtplx_ssd_free_bytes",
            "Free bytes on the SSD tier's file system.",
            space.free_bytes,
        ));
    }
    for (name, help, v) in gauges {
        write_scalar(&mut text, Kind::Gauge, name, help, v);
    }
    let counters = [
        (
            "mtplx_bank_spills_queued_total",
            "Bank entries queued for the SSD tier.",
            bank.spills_queued,
        ),
        (
            "mtplx_bank_spills_written_total",
            "Writes to the SSD tier that committed.",
            bank.spills_written,
        ),
        (
            "mtplx_bank_spills_failed_total",
            "Writes to the SSD tier that were queued and failed.",
            bank.spills_failed,
        ),
        (
            "mtplx_bank_idle_writes_total",
            "Idle conversations written behind to the SSD tier.",
            bank.idle_writes,
        ),
        (
            "mtplx_bank_entries_lost_total",
            "Conversations dropped unwritten: memory had to be freed and the SSD tier could not take them.",
            bank.entries_lost,
        ),
        (
            "mtplx_bank_refused_total",
            "Requests refused by admission (HTTP 507).",
            bank.refused,
        ),
        (
            "mtplx_bank_shed_entries_total",
            "Bank entries shed to admit a request.",
            bank.shed_entries,
        ),
    ];
    for (name, help, v) in counters {
        write_scalar(&mut text, Kind::Counter, name, help, v);
    }
    let failures = Family::new(
        "mtplx_bank_spill_failures_total",
        "Writes the SSD tier refused before they were queued, or failed, by reason.",
        "reason",
    );
    for (reason, n) in &bank.spill_failures {
        failures.add(*reason, *n);
    }
    failures.render(&mut text);
    text_response(text, "text/plain; version=0.0.4; charset=utf-8")
}
