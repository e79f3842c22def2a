//! The patterns page: failure patterns of the last 24 h with their trend and example messages.

use std::sync::Arc;

use brownout_protocol::now_ms;

use super::{HOUR_MS, LiveDataSource, finite, lock};
use crate::patterns::engine::{Pattern, PatternId};
use crate::store::{FailureQuery, FailureRow};
use crate::web::model::{
    PatternDetail, PatternExample, PatternSummary, PatternsView, Point, UiError,
};

/// Patterns whose examples are looked up in the store (one query each).
const PATTERNS_WITH_EXAMPLES: usize = 20;

pub(super) fn pattern_detail(p: Pattern, examples: Vec<PatternExample>, now: u64) -> PatternDetail {
    let hour_ago = now.saturating_sub(HOUR_MS);
    // Buckets overlapping the last hour (the engine counts per bucket).
    let buckets: Vec<_> = p.counts.iter().collect();
    let width = match buckets.as_slice() {
        [.., a, b] => b.start_ms.saturating_sub(a.start_ms),
        _ => HOUR_MS,
    }
    .max(1);
    let count_1h = buckets
        .iter()
        .filter(|c| c.start_ms + width > hour_ago)
        .map(|c| c.count)
        .sum();
    PatternDetail {
        summary: PatternSummary {
            id: p.id.0.clone(),
            template: p.label.clone(),
            category: p.category,
            count_1h,
            impact: finite(p.budget_impact),
            services: p.services.clone(),
            is_new: p.is_new,
        },
        trend: p
            .counts
            .iter()
            .map(|c| Point::new(c.start_ms, c.count as f64))
            .collect(),
        examples,
    }
}

/// A pattern's examples: the stored failures found for it, else its example trace ids with the
/// template as the message.
fn examples_of(p: &Pattern, rows: Vec<FailureRow>) -> Vec<PatternExample> {
    if !rows.is_empty() {
        return rows
            .into_iter()
            .map(|r| PatternExample {
                frames: crate::patterns::trace::shown_frames(
                    &r.event.message,
                    r.event
                        .attributes
                        .get("exception.stacktrace")
                        .map(String::as_str),
                ),
                ts_ms: r.event.ts_ms,
                service: r.event.service,
                message: r.event.message,
                trace_id: r.event.trace_id,
                trace_url: None,
            })
            .collect();
    }
    p.example_trace_ids
        .iter()
        .map(|t| PatternExample {
            ts_ms: p.last_seen_ms,
            service: p.services.first().cloned().unwrap_or_default(),
            message: p.label.clone(),
            trace_id: t.clone(),
            trace_url: None,
            frames: Vec::new(),
        })
        .collect()
}

impl LiveDataSource {
    /// The latest published patterns ([`crate::patterns::feed`]) with details, computed once
    /// per publication.
    pub(super) async fn patterns_now(&self, now: u64) -> Result<Arc<Vec<PatternDetail>>, UiError> {
        let snapshot = self.parts.patterns.borrow().clone();
        if let Some((at, p)) = &lock(&self.caches).patterns
            && *at == snapshot.computed_at_ms
        {
            return Ok(p.clone());
        }
        let mut out = Vec::with_capacity(snapshot.patterns.len());
        for (i, p) in snapshot.patterns.iter().cloned().enumerate() {
            let examples = if i < PATTERNS_WITH_EXAMPLES {
                self.examples(&p, now).await
            } else {
                Vec::new()
            };
            out.push(pattern_detail(p, examples, now));
        }
        let out = Arc::new(out);
        lock(&self.caches).patterns = Some((snapshot.computed_at_ms, out.clone()));
        Ok(out)
    }

    /// Raw messages of a pattern: failures the ingest tagger labelled with one of its
    /// templates' ids; failing that, its example trace ids with the template as the message.
    async fn examples(&self, p: &Pattern, now: u64) -> Vec<PatternExample> {
        let mut rows: Vec<FailureRow> = Vec::new();
        for t in p.templates.iter().take(3) {
            if rows.len() >= 3 {
                break;
            }
            let q = FailureQuery {
                since_ms: p.first_seen_ms.min(now.saturating_sub(24 * HOUR_MS)),
                until_ms: now + 1,
                pattern: Some(PatternId::from_template(*t).0),
                limit: 3 - rows.len(),
                ..FailureQuery::default()
            };
            match self.store().failures(&q).await {
                Ok(page) => rows.extend(page.items),
                Err(e) => {
                    tracing::warn!(error = %e, "web: cannot read pattern examples");
                    break;
                }
            }
        }
        let mut ex = examples_of(p, rows);
        for e in &mut ex {
            e.trace_url = self.trace_link(&e.trace_id);
        }
        ex
    }

    pub(super) async fn patterns_view(&self) -> Result<PatternsView, UiError> {
        let now = now_ms();
        let p = self.patterns_now(now).await?;
        Ok(PatternsView {
            origin: self.parts.origin,
            generated_at_ms: now,
            patterns: p.as_ref().clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brownout_protocol::{Category, FailureEvent};

    fn row(message: &str, stacktrace: Option<&str>) -> FailureRow {
        let mut attributes = std::collections::BTreeMap::new();
        if let Some(s) = stacktrace {
            attributes.insert("exception.stacktrace".to_string(), s.to_string());
        }
        FailureRow {
            id: "r1".into(),
            pattern: String::new(),
            event: FailureEvent {
                ts_ms: 1,
                service: "agent".into(),
                host: String::new(),
                request_id: String::new(),
                trace_id: "t".into(),
                user_id: String::new(),
                feature: String::new(),
                criticality: Default::default(),
                category: Category::Other,
                error_type: String::new(),
                message: message.into(),
                latency_ms: 0.0,
                attributes,
            },
        }
    }

    #[test]
    fn an_examples_frames_come_from_its_trace_innermost_first() {
        let java = "java.net.SocketTimeoutException: Read timed out\n\tat com.x.Client.call(Client.java:42)\n\tat java.base/java.lang.Thread.run(Thread.java:833)";
        let py = "Traceback (most recent call last):\n  File \"/app/a.py\", line 3, in outer\n    inner()\n  File \"/app/b.py\", line 9, in inner\n    raise KeyError('x')\nKeyError: 'x'";
        let pattern = Pattern {
            id: PatternId("p".into()),
            label: String::new(),
            category: Category::Other,
            templates: Vec::new(),
            first_seen_ms: 0,
            last_seen_ms: 0,
            count: 0,
            counts: Vec::new(),
            affected_users: 0,
            affected_requests: 0,
            services: Vec::new(),
            features: Vec::new(),
            error_types: Vec::new(),
            budget_impact: 0.0,
            slo_impact: Vec::new(),
            example_trace_ids: Vec::new(),
            trend: crate::patterns::engine::Trend {
                direction: crate::patterns::engine::TrendDirection::New,
                previous_count: 0,
                change_ratio: None,
            },
            is_new: true,
        };
        let ex = examples_of(
            &pattern,
            vec![
                row(java, None),
                row("Read timed out", Some(java)),
                row(py, None),
                row("one line", None),
            ],
        );
        assert_eq!(
            ex[0].frames,
            vec![
                "[app] call (com.x.Client:42)".to_string(),
                "run (java.lang.Thread:833)".to_string()
            ]
        );
        assert_eq!(ex[1].frames, ex[0].frames, "from exception.stacktrace");
        assert_eq!(
            ex[2].frames,
            vec![
                "[app] inner (/app/b.py:9)".to_string(),
                "[app] outer (/app/a.py:3)".to_string()
            ]
        );
        assert!(ex[3].frames.is_empty());
    }
}
