//! Clustering templates into failure patterns: DBSCAN (linfa-clustering) over TF-IDF vectors of
//! template words plus the event's category, error type, service, feature and model.
//!
//! ```text
//!  v = normalize( [ tfidf(words) hashed into 512 dims, unit length ]
//!               ⊕ [ one-hot category (none for `other`)             ] × 2.0
//!               ⊕ [ error type, service, feature, model (hashed)   ] × 0.5 )
//! ```
//!
//! With unit vectors, L2 distance ε = 0.65 means cosine ≥ 0.79. Two templates of different known
//! categories reach at most cosine 0.24, so a pattern never mixes them ("KV cache exhausted"
//! never joins a tool timeout). Within a known category and error type the templates join
//! whatever their words ("tool call to the weather API timed out" joins "tool <*> exceeded its
//! deadline"): a pattern is a failure *kind*, as in docs/REQUIREMENTS.md R1.3. With another
//! error type or service the words must share a little (text cosine ≳ 0.05–0.15). For `other` (plain logs,
//! no category) only near-identical wording (text cosine ≳ 0.79) joins.
//! DBSCAN noise points become patterns of their own. Only the `max_items` most frequent templates
//! are clustered (DBSCAN here is O(n²)); the rest are singletons.

use linfa::traits::Transformer;
use linfa_clustering::Dbscan;
use linfa_nn::{CommonNearestNeighbour, distance::L2Dist};
use ndarray::Array2;

use super::hash::stable_hash;
use super::mask::WILDCARD;

const TEXT_DIMS: usize = 512;
const CATEGORY_DIMS: usize = 16;
const META_DIMS: usize = 64;

/// What clustering looks at for one template.
#[derive(Debug, Clone, Default)]
pub struct ClusterItem<'a> {
    pub template: &'a str,
    pub category: &'a str,
    pub error_type: &'a str,
    pub service: &'a str,
    pub feature: &'a str,
    pub model: &'a str,
    /// How often the template was seen (picks which templates are clustered when capped).
    pub count: u64,
}

/// Clustering knobs; the defaults are the product's one configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// DBSCAN neighbourhood radius (L2 between unit vectors).
    pub eps: f64,
    /// Templates clustered at most; the rest become singletons.
    pub max_items: usize,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            eps: 0.65,
            max_items: 2000,
        }
    }
}

/// Lower-cased words of a template: the alphabetic runs of its non-wildcard tokens.
fn words(template: &str) -> impl Iterator<Item = String> + '_ {
    template
        .split(' ')
        .filter(|t| *t != WILDCARD)
        .flat_map(|t| t.split(|c: char| !c.is_alphanumeric()))
        .filter(|w| w.len() > 1 && w.chars().any(char::is_alphabetic))
        .map(str::to_lowercase)
}

fn slot(s: &str, salt: &[u8], dims: usize) -> usize {
    (stable_hash(&[salt, s.as_bytes()]) % dims as u64) as usize
}

fn normalize(row: &mut [f64]) {
    let n = row.iter().map(|x| x * x).sum::<f64>().sqrt();
    if n > 0.0 {
        row.iter_mut().for_each(|x| *x /= n);
    }
}

/// The feature matrix: one unit row per item.
pub fn features(items: &[ClusterItem<'_>]) -> Array2<f64> {
    let dims = TEXT_DIMS + CATEGORY_DIMS + META_DIMS;
    let docs: Vec<Vec<String>> = items
        .iter()
        .map(|it| words(it.template).collect())
        .collect();
    // Document frequency per hashed word.
    let mut df = vec![0u32; TEXT_DIMS];
    for d in &docs {
        let mut seen = [false; TEXT_DIMS];
        for w in d {
            seen[slot(w, b"w", TEXT_DIMS)] = true;
        }
        for (i, s) in seen.iter().enumerate() {
            df[i] += u32::from(*s);
        }
    }
    let n = items.len().max(1) as f64;
    let mut m = Array2::<f64>::zeros((items.len(), dims));
    for (r, (it, d)) in items.iter().zip(&docs).enumerate() {
        let mut row = vec![0.0; dims];
        let text = &mut row[..TEXT_DIMS];
        for w in d {
            let s = slot(w, b"w", TEXT_DIMS);
            text[s] += ((1.0 + n) / (1.0 + f64::from(df[s]))).ln() + 1.0;
        }
        normalize(text);
        // A known category weighs 2 (templates of one category and error type join unless
        // their words share almost nothing); `other` says nothing, so only the words decide.
        let cat = &mut row[TEXT_DIMS..TEXT_DIMS + CATEGORY_DIMS];
        let cat_slot = brownout_protocol::Category::ALL
            .iter()
            .position(|c| c.as_str() == it.category)
            .unwrap_or_else(|| slot(it.category, b"c", CATEGORY_DIMS));
        cat[cat_slot] = if it.category == "other" || it.category.is_empty() {
            0.0
        } else {
            2.0
        };
        let meta = &mut row[TEXT_DIMS + CATEGORY_DIMS..];
        // Error type and service name a failure kind; feature and model vary more per event.
        for (salt, v, w) in [
            (b"e", it.error_type, 1.0),
            (b"s", it.service, 1.0),
            (b"f", it.feature, 0.4),
            (b"m", it.model, 0.4),
        ] {
            if !v.is_empty() {
                meta[slot(v, salt, META_DIMS)] += w;
            }
        }
        normalize(meta);
        meta.iter_mut().for_each(|x| *x *= 0.5);
        normalize(&mut row);
        m.row_mut(r).assign(&ndarray::Array1::from(row));
    }
    m
}

/// Clusters items; returns a dense cluster index (0..k) per item, in input order. Cluster
/// indices are numbered by the first item that belongs to them, so equal input gives equal
/// output.
pub fn cluster(items: &[ClusterItem<'_>], config: &ClusterConfig) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| items[b].count.cmp(&items[a].count).then(a.cmp(&b)));
    let chosen: Vec<usize> = order.iter().copied().take(config.max_items).collect();
    let sub: Vec<ClusterItem<'_>> = chosen.iter().map(|&i| items[i].clone()).collect();
    let mut raw: Vec<Option<usize>> = vec![None; items.len()];
    if sub.len() >= 2 {
        let x = features(&sub);
        let labels = Dbscan::params_with(2, L2Dist, CommonNearestNeighbour::LinearSearch)
            .tolerance(config.eps)
            .transform(&x);
        if let Ok(labels) = labels {
            for (k, &i) in chosen.iter().enumerate() {
                raw[i] = labels[k];
            }
        }
    }
    // Renumber: DBSCAN clusters by first member, noise as singletons.
    let mut out = vec![0usize; items.len()];
    let mut map = std::collections::HashMap::new();
    let mut next = 0usize;
    for (i, r) in raw.iter().enumerate() {
        out[i] = match r {
            Some(c) => *map.entry(*c).or_insert_with(|| {
                next += 1;
                next - 1
            }),
            None => {
                next += 1;
                next - 1
            }
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item<'a>(template: &'a str, category: &'a str) -> ClusterItem<'a> {
        ClusterItem {
            template,
            category,
            error_type: "AgentExecutionFailed",
            service: "muse-agent",
            count: 1,
            ..Default::default()
        }
    }

    #[test]
    fn tool_timeouts_join_and_kv_exhaustion_stays_apart() {
        let items = [
            item(
                "tool call to the weather API timed out after <*> ms",
                "tool_unavailable",
            ),
            item(
                "tool call to the hotel API timed out after <*> ms",
                "tool_unavailable",
            ),
            item(
                "tool <*> call timed out after <*> ms (attempt <*>)",
                "tool_unavailable",
            ),
            item(
                "KV cache exhausted: no free blocks for seq <*>",
                "kv_cache_exhausted",
            ),
            item(
                "KV cache usage <*> above watermark, request <*> preempted",
                "kv_cache_exhausted",
            ),
            item(
                "failed to deserialize JSON payload at byte <*>: invalid UTF-8",
                "serialization_error",
            ),
        ];
        let c = cluster(&items, &ClusterConfig::default());
        assert_eq!(c[0], c[1]);
        assert_eq!(c[0], c[2]);
        assert_ne!(c[0], c[3]);
        assert_ne!(c[3], c[5]);
        assert_ne!(c[0], c[5]);
    }

    #[test]
    fn same_words_different_category_never_join() {
        let items = [
            item("request failed after <*> ms", "timeout_network"),
            item("request failed after <*> ms", "timeout_resource"),
        ];
        let c = cluster(&items, &ClusterConfig::default());
        assert_ne!(c[0], c[1]);
    }

    #[test]
    fn capped_items_become_singletons_and_output_is_deterministic() {
        let items: Vec<ClusterItem<'_>> = (0..10)
            .map(|_| item("same words every time", "other"))
            .collect();
        let cfg = ClusterConfig {
            max_items: 4,
            ..ClusterConfig::default()
        };
        let a = cluster(&items, &cfg);
        assert_eq!(a, cluster(&items, &cfg));
        assert_eq!(a.iter().filter(|&&x| x == a[0]).count(), 4);
        assert!(cluster(&[], &cfg).is_empty());
        assert_eq!(cluster(&items[..1], &cfg), vec![0]);
    }
}
