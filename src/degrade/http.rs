//! The degradation component's HTTP routes: the Alertmanager webhook (`POST /v1/alertmanager`)
//! and the operator API (`GET /api/v1/degrade`, `POST|DELETE /api/v1/degrade/override`,
//! `POST|DELETE /api/v1/degrade/instances/{instance_id}`). Auth
//! is the composition root's ([`crate::auth::require_degrade_role`]).

use std::collections::BTreeMap;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use brownout_protocol::{Tier, now_ms};
use serde::Deserialize;

use super::controller::{InstanceOverride, Override};
use super::handle::{AlertChange, DegradeHandle, DegradeStatus};
pub use crate::error::ApiError;

/// Alertmanager's webhook payload (version 4). Unknown fields are ignored: Alertmanager adds
/// fields over time.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlertmanagerWebhook {
    pub version: String,
    #[serde(default)]
    pub group_key: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub receiver: String,
    #[serde(default)]
    pub group_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub common_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub external_url: String,
    pub alerts: Vec<AlertmanagerAlert>,
}

/// One alert of an Alertmanager webhook.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlertmanagerAlert {
    pub status: String,
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub starts_at: Option<String>,
    #[serde(default)]
    pub ends_at: Option<String>,
    #[serde(default, rename = "generatorURL")]
    pub generator_url: String,
    #[serde(default)]
    pub fingerprint: String,
}

impl AlertmanagerWebhook {
    /// The alerts as the handle keeps them.
    ///
    /// # Errors
    /// [`ApiError`] 400 when the payload is not a version-4 webhook, an alert lacks `alertname`,
    /// or its status is neither `firing` nor `resolved`.
    pub fn changes(&self) -> Result<Vec<AlertChange>, ApiError> {
        if self.version != "4" {
            return Err(ApiError::bad_request(
                "unsupported_version",
                format!(
                    "Alertmanager webhook version {:?} is not supported (expected \"4\")",
                    self.version
                ),
            ));
        }
        let mut parsed = Vec::with_capacity(self.alerts.len());
        for (i, a) in self.alerts.iter().enumerate() {
            let name = a
                .labels
                .get("alertname")
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "missing_alertname",
                        format!("alerts[{i}].labels.alertname is missing"),
                    )
                })?;
            let firing = match a.status.as_str() {
                "firing" => true,
                "resolved" => false,
                other => {
                    return Err(ApiError::bad_request(
                        "bad_status",
                        format!("alerts[{i}].status {other:?} is not firing or resolved"),
                    ));
                }
            };
            let key = if a.fingerprint.is_empty() {
                let labels: Vec<String> =
                    a.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                labels.join(",")
            } else {
                a.fingerprint.clone()
            };
            let ends_at_ms = a
                .ends_at
                .as_deref()
                .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
                .map(|t| t.timestamp_millis())
                .filter(|ms| *ms > 0)
                .map_or(0, |ms| u64::try_from(ms).unwrap_or(0));
            parsed.push(AlertChange {
                key,
                name: name.clone(),
                firing,
                ends_at_ms,
            });
        }
        Ok(parsed)
    }
}

impl DegradeHandle {
    /// Applies an Alertmanager webhook; returns how many alerts are firing afterwards.
    ///
    /// # Errors
    /// [`ApiError`] 400 when the payload is not a version-4 webhook or an alert lacks `alertname`.
    pub fn alertmanager_webhook(
        &self,
        hook: &AlertmanagerWebhook,
        now_ms: u64,
    ) -> Result<usize, ApiError> {
        Ok(self.apply_alertmanager(hook.changes()?, now_ms))
    }
}

/// `POST /api/v1/degrade/override` body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideRequest {
    pub tier: u8,
    pub duration_secs: u64,
    pub reason: String,
}

const MAX_OVERRIDE_SECS: u64 = 7 * 24 * 3600;

/// An override's `duration_secs` (1 to [`MAX_OVERRIDE_SECS`]) and its reason (1–512 bytes after
/// trimming, returned trimmed), checked the same way for the fleet and for one instance.
fn checked_duration_and_reason(duration_secs: u64, reason: &str) -> Result<&str, ApiError> {
    if duration_secs == 0 || duration_secs > MAX_OVERRIDE_SECS {
        return Err(ApiError::bad_request(
            "invalid_duration",
            format!("duration_secs must be between 1 and {MAX_OVERRIDE_SECS}"),
        ));
    }
    let reason = reason.trim();
    if reason.is_empty() || reason.len() > 512 {
        return Err(ApiError::bad_request(
            "invalid_reason",
            "reason must be 1-512 characters",
        ));
    }
    Ok(reason)
}

/// `POST /api/v1/degrade/instances/{instance_id}` body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceOverrideRequest {
    #[serde(default)]
    pub max_num_seqs: Option<u32>,
    #[serde(default)]
    pub drain: Option<bool>,
    pub duration_secs: u64,
    pub reason: String,
}

/// At most this many operator per-instance actions at once.
pub const MAX_INSTANCE_OVERRIDES: usize = 1024;

/// The checks the serving tier applies to its own `--instance-id`.
fn check_instance_id(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id.bytes().all(|b| b.is_ascii_graphic())
        && id != brownout_protocol::ALL_INSTANCES;
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "invalid_instance",
            "instance_id must be 1-128 visible ASCII characters and not `*`",
        ))
    }
}

async fn post_instance(
    State(h): State<DegradeHandle>,
    Path(instance): Path<String>,
    body: Result<Json<InstanceOverrideRequest>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    check_instance_id(&instance)?;
    let Json(req) = body?;
    if req.max_num_seqs.is_none() && req.drain.is_none() {
        return Err(ApiError::bad_request(
            "empty_action",
            "give max_num_seqs, drain, or both",
        ));
    }
    if req.max_num_seqs == Some(0) {
        return Err(ApiError::bad_request(
            "invalid_max_num_seqs",
            "max_num_seqs must be at least 1 (use drain to stop default traffic)",
        ));
    }
    let reason = checked_duration_and_reason(req.duration_secs, &req.reason)?;
    let now = now_ms();
    let existing = h.instance_overrides();
    let active = existing.iter().filter(|(_, o)| o.until_ms > now).count();
    if !existing.contains_key(&instance) && active >= MAX_INSTANCE_OVERRIDES {
        return Err(ApiError::bad_request(
            "too_many_instance_actions",
            format!("at most {MAX_INSTANCE_OVERRIDES} operator instance actions at once"),
        ));
    }
    let o = InstanceOverride {
        max_num_seqs: req.max_num_seqs,
        drain: req.drain,
        until_ms: now + req.duration_secs * 1000,
        reason: reason.to_string(),
        set_at_ms: now,
    };
    tracing::info!(instance = %instance, max_num_seqs = ?o.max_num_seqs, drain = ?o.drain, until_ms = o.until_ms, reason = %o.reason, "operator instance action set");
    h.set_instance_override(&instance, o.clone());
    Ok(Json(serde_json::json!({"instance": instance, "action": o})))
}

async fn delete_instance(
    State(h): State<DegradeHandle>,
    Path(instance): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    check_instance_id(&instance)?;
    let removed = h.clear_instance_override(&instance);
    tracing::info!(instance = %instance, removed, "operator instance action cleared");
    Ok(Json(
        serde_json::json!({"instance": instance, "removed": removed}),
    ))
}

async fn post_alertmanager(
    State(h): State<DegradeHandle>,
    body: Result<Json<AlertmanagerWebhook>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Json(hook) = body?;
    let firing = h.alertmanager_webhook(&hook, now_ms())?;
    Ok(Json(
        serde_json::json!({"accepted": hook.alerts.len(), "firing": firing}),
    ))
}

async fn post_override(
    State(h): State<DegradeHandle>,
    body: Result<Json<OverrideRequest>, JsonRejection>,
) -> Result<Json<Override>, ApiError> {
    let Json(req) = body?;
    let tier = Tier::try_from(req.tier)
        .map_err(|e| ApiError::bad_request("invalid_tier", e.to_string()))?;
    let reason = checked_duration_and_reason(req.duration_secs, &req.reason)?;
    let o = Override {
        tier,
        until_ms: now_ms() + req.duration_secs * 1000,
        reason: reason.to_string(),
    };
    tracing::info!(tier = %o.tier, until_ms = o.until_ms, reason = %o.reason, "operator override set");
    // Shared at once (the controller loop is woken), but not waited for: a pin set while Redis
    // is down is kept here and shared when it is back (the redis-restart drill relies on it).
    h.set_override(o.clone());
    Ok(Json(o))
}

/// How long an override change may take to reach Redis before the API says it did not.
const SHARE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Answers only once the change is in Redis (a crash right after the answer cannot lose it,
/// and no fresh replica can miss it); 503 when Redis did not take it in time (the change stays
/// pending here and is retried every interval).
async fn override_shared(h: &DegradeHandle, seq: u64) -> Result<(), ApiError> {
    if h.override_shared_within(seq, SHARE_WAIT).await {
        Ok(())
    } else {
        Err(ApiError::unavailable(
            "override_not_shared",
            "the change is made on this replica but Redis did not take it within 5 s; it is retried every interval — check GET /api/v1/degrade, or repeat the request",
            5,
        ))
    }
}

async fn delete_override(
    State(h): State<DegradeHandle>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (removed, seq) = h.clear_override();
    tracing::info!(removed, "operator override cleared");
    override_shared(&h, seq).await?;
    Ok(Json(serde_json::json!({"removed": removed})))
}

async fn get_status(State(h): State<DegradeHandle>) -> Json<DegradeStatus> {
    Json(h.status())
}

/// `POST /v1/alertmanager`, `POST|DELETE /api/v1/degrade/override`, `GET /api/v1/degrade`,
/// `POST|DELETE /api/v1/degrade/instances/{instance_id}` (the id may contain `/`, e.g.
/// `gpu-3/engine-0`, written as is or as `%2F`).
/// The composition root puts them behind [`crate::auth::require_degrade_role`].
pub fn router(handle: DegradeHandle) -> Router {
    Router::new()
        .route("/v1/alertmanager", post(post_alertmanager))
        .route("/api/v1/degrade", get(get_status))
        .route(
            "/api/v1/degrade/override",
            post(post_override).delete(delete_override),
        )
        .route(
            "/api/v1/degrade/instances/{*instance_id}",
            post(post_instance).delete(delete_instance),
        )
        .with_state(handle)
}
