//! `GET /openapi.json`: the routes this server answers, as an OpenAPI 3.1 document.

use serde_json::{json, Value};

fn op(summary: &str, request: Option<&str>) -> Value {
    let mut op = json!({
        "summary": summary,
        "responses": {
            "200": { "description": "Success" },
            "400": { "$ref": "#/components/responses/Error" },
            "401": { "$ref": "#/components/responses/Error" },
        },
    });
    if let Some(schema) = request {
        op["requestBody"] = json!({
            "required": true,
            "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } },
        });
        for code in ["404", "413", "503"] {
            op["responses"][code] = json!({ "$ref": "#/components/responses/Error" });
        }
    }
    op
}

/// The document.
pub fn document() -> Value {
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "mtplx",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "OpenAI- and Anthropic-compatible inference server.",
        },
        "paths": {
            "/v1/chat/completions": { "post": op("Chat completion (streaming with `stream: true`)", Some("ChatCompletionRequest")) },
            "/v1/completions": { "post": op("Text completion from a raw prompt", Some("CompletionRequest")) },
            "/v1/messages": { "post": op("Anthropic Messages", Some("MessagesRequest")) },
            "/v1/messages/count_tokens": { "post": op("Anthropic token count", Some("MessagesRequest")) },
            "/v1/responses": { "post": op("OpenAI Responses (stateless)", Some("ResponsesRequest")) },
            "/v1/models": { "get": op("The served model", None) },
            "/v1/models/{id}": { "get": op("One model", None) },
            "/health": { "get": op("Liveness (no key needed)", None) },
            "/metrics": { "get": op("Prometheus metrics", None) },
            "/openapi.json": { "get": op("This document", None) },
            "/admin/sessions": { "get": op("Sessions in the RAM bank (admin)", None) },
            "/admin/cache/clear": { "post": op("Forget every bank entry (admin)", None) },
            "/admin/sessions/{id}/clear": { "post": op("Forget one session's entries (admin)", None) },
            "/admin/cache/ssd": { "get": op("The SSD tier's mode and usage (admin)", None) },
        },
        "components": {
            "securitySchemes": {
                "bearer": { "type": "http", "scheme": "bearer" },
                "apiKey": { "type": "apiKey", "in": "header", "name": "x-api-key" },
            },
            "responses": {
                "Error": {
                    "description": "An error in OpenAI's shape (Anthropic's under /v1/messages)",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } },
                },
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": { "error": { "type": "object", "properties": {
                        "message": { "type": "string" }, "type": { "type": "string" },
                        "param": { "type": ["string", "null"] }, "code": { "type": ["string", "null"] },
                    } } },
                },
                "ChatCompletionRequest": {
                    "type": "object",
                    "required": ["messages"],
                    "properties": {
                        "model": { "type": "string" },
                        "messages": { "type": "array", "items": { "type": "object" } },
                        "stream": { "type": "boolean" },
                        "max_tokens": { "type": "integer", "minimum": 1 },
                        "max_completion_tokens": { "type": "integer", "minimum": 1 },
                        "temperature": { "type": "number", "minimum": 0, "default": 0.6 },
                        "top_p": { "type": "number", "default": 0.95 },
                        "top_k": { "type": "integer", "default": 20 },
                        "min_p": { "type": "number" },
                        "presence_penalty": { "type": "number" },
                        "frequency_penalty": { "type": "number" },
                        "repetition_penalty": { "type": "number" },
                        "seed": { "type": "integer" },
                        "stop": { "type": ["string", "array"] },
                        "tools": { "type": "array" },
                        "tool_choice": {},
                    },
                },
                "CompletionRequest": {
                    "type": "object",
                    "required": ["prompt"],
                    "properties": { "prompt": { "type": ["string", "array"] }, "max_tokens": { "type": "integer" } },
                },
                "MessagesRequest": {
                    "type": "object",
                    "required": ["messages"],
                    "properties": { "messages": { "type": "array" }, "max_tokens": { "type": "integer" }, "system": {} },
                },
                "ResponsesRequest": {
                    "type": "object",
                    "required": ["input"],
                    "properties": { "input": {}, "instructions": { "type": "string" }, "max_output_tokens": { "type": "integer" } },
                },
            },
        },
        "security": [{ "bearer": [] }, { "apiKey": [] }],
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_route_is_documented() {
        let doc = super::document();
        for path in [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/messages",
            "/v1/responses",
            "/v1/models",
            "/health",
            "/metrics",
        ] {
            assert!(doc["paths"][path].is_object(), "{path}");
        }
    }
}
