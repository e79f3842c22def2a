//! Redis key names for one cluster, and the ack format.
//!
//! All keys of cluster `C` share the hash tag `{C}` so they live in one Redis Cluster slot and a
//! MULTI/EXEC or Lua script may touch them together:
//!
//! ```text
//! brownout:{C}:state    hash     epoch, version, command (JSON), sig
//! brownout:{C}:notify   channel  "<epoch>:<version>"
//! brownout:{C}:log      stream   every command (MAXLEN ~ 10000)
//! brownout:{C}:acks     hash     instance id -> Ack
//! brownout:{C}:leader   string   "<replica id>:<fencing token>" with PX expiry
//! ```

use std::fmt;

use crate::command::EntryApplied;

/// The cluster every binary uses when none is configured: the control plane's
/// `control.cluster`, the serving tier's `--cluster` and the demo all default to it, so that a
/// first run with no configuration puts the publisher and the subscribers on the same keys.
pub const DEFAULT_CLUSTER: &str = "default";

/// The environment variable every binary reads the cluster from (it overrides
/// `control.cluster` in the control plane's config file; a `--cluster` flag overrides it).
pub const CLUSTER_ENV: &str = "BROWNOUT_CLUSTER";

/// The cluster from the environment ([`CLUSTER_ENV`]), `None` when unset or empty.
pub fn cluster_from_env() -> Option<String> {
    std::env::var(CLUSTER_ENV).ok().filter(|c| !c.is_empty())
}

/// A cluster name that is not usable inside a Redis hash tag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cluster name {0:?} is invalid: use 1-64 characters from A-Z a-z 0-9 . _ -")]
pub struct ClusterNameError(pub String);

/// The Redis keys of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisKeys {
    cluster: String,
}

impl RedisKeys {
    /// # Errors
    /// [`ClusterNameError`] when the name is empty, too long, or holds characters (such as `{`,
    /// `}` or `:`) that would break the hash tag or the key layout.
    pub fn new(cluster: &str) -> Result<RedisKeys, ClusterNameError> {
        let ok = !cluster.is_empty()
            && cluster.len() <= 64
            && cluster
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if ok {
            Ok(RedisKeys {
                cluster: cluster.to_string(),
            })
        } else {
            Err(ClusterNameError(cluster.into()))
        }
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }
    fn key(&self, suffix: &str) -> String {
        format!("brownout:{{{}}}:{}", self.cluster, suffix)
    }
    pub fn state(&self) -> String {
        self.key("state")
    }
    pub fn notify(&self) -> String {
        self.key("notify")
    }
    pub fn log(&self) -> String {
        self.key("log")
    }
    pub fn acks(&self) -> String {
        self.key("acks")
    }
    pub fn leader(&self) -> String {
        self.key("leader")
    }
    /// The counter the publisher increments for versions.
    pub fn version_counter(&self) -> String {
        self.key("version")
    }
    /// The counter that hands out leader epochs (fencing tokens).
    pub fn epoch_counter(&self) -> String {
        self.key("epoch")
    }
    /// The operator's pinned tier (JSON, `PX` until it ends), shared by all control-plane
    /// replicas so an override posted to any of them reaches the leader.
    pub fn operator_override(&self) -> String {
        self.key("override")
    }
    /// The counter that versions the operator override (only grows): a sealed override is in
    /// force only while its version is this counter's value, so an older one written back is
    /// refused.
    pub fn override_version(&self) -> String {
        self.key("override_version")
    }

    /// The operator's per-instance actions (sealed JSON map: instance id → action).
    pub fn instance_overrides(&self) -> String {
        self.key("instance_overrides")
    }
}

/// The `notify` payload: `"<epoch>:<version>"`.
pub fn notify_payload(epoch: u64, version: u64) -> String {
    format!("{epoch}:{version}")
}

/// Parses a `notify` payload.
pub fn parse_notify(s: &str) -> Option<(u64, u64)> {
    let (e, v) = s.split_once(':')?;
    Some((e.parse().ok()?, v.parse().ok()?))
}

/// What a serving instance wrote in the acks hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ack {
    /// `"<epoch>:<version>:<applied_at_ms>"`, plus `":entry=<own|*|own+*>"` when the command had
    /// an `instances` entry for this instance (its own, the `"*"` one, or both merged).
    Applied {
        epoch: u64,
        version: u64,
        applied_at_ms: u64,
        /// Which `instances` entries were applied (`None`: none addressed this instance).
        entry: Option<EntryApplied>,
    },
    /// `"nack:<epoch>:<version>:<at_ms>:<reason>"`
    Refused {
        epoch: u64,
        version: u64,
        at_ms: u64,
        reason: String,
    },
}

/// An acks-hash value that is neither form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed ack {0:?}")]
pub struct AckParseError(pub String);

impl fmt::Display for Ack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ack::Applied {
                epoch,
                version,
                applied_at_ms,
                entry,
            } => {
                write!(f, "{epoch}:{version}:{applied_at_ms}")?;
                match entry.and_then(|e| e.as_str()) {
                    Some(e) => write!(f, ":entry={e}"),
                    None => Ok(()),
                }
            }
            Ack::Refused {
                epoch,
                version,
                at_ms,
                reason,
            } => {
                write!(f, "nack:{epoch}:{version}:{at_ms}:{reason}")
            }
        }
    }
}

impl std::str::FromStr for Ack {
    type Err = AckParseError;
    fn from_str(s: &str) -> Result<Ack, AckParseError> {
        let err = || AckParseError(s.to_string());
        if let Some(rest) = s.strip_prefix("nack:") {
            let mut it = rest.splitn(4, ':');
            let epoch = it.next().and_then(|x| x.parse().ok()).ok_or_else(err)?;
            let version = it.next().and_then(|x| x.parse().ok()).ok_or_else(err)?;
            let at_ms = it.next().and_then(|x| x.parse().ok()).ok_or_else(err)?;
            let reason = it.next().unwrap_or("").to_string();
            return Ok(Ack::Refused {
                epoch,
                version,
                at_ms,
                reason,
            });
        }
        let mut it = s.split(':');
        let mut num = || {
            it.next()
                .and_then(|x| x.parse::<u64>().ok())
                .ok_or_else(err)
        };
        let (epoch, version, applied_at_ms) = (num()?, num()?, num()?);
        // Then optional `key=value` segments: `entry` is known, other keys (from a newer
        // serving tier) are skipped; a segment that is not `key=value` is malformed.
        let mut entry = None;
        for seg in it {
            let (k, v) = seg.split_once('=').ok_or_else(err)?;
            if k == "entry" {
                entry = Some(EntryApplied::parse(v).ok_or_else(err)?);
            }
        }
        Ok(Ack::Applied {
            epoch,
            version,
            applied_at_ms,
            entry,
        })
    }
}

impl Ack {
    /// The domain an ack of `instance` is sealed under.
    fn domain(instance: &str) -> String {
        format!("brownout-ack:{instance}")
    }

    /// The acks-hash value for `instance`: the plain form plus `;sig=<hex>` (HMAC with the
    /// command key over the instance id and the ack), so whoever can write Redis but lacks the
    /// key cannot fake "applied" for an instance, nor copy one instance's ack to another.
    pub fn to_signed(&self, key: &[u8], instance: &str) -> String {
        crate::signing::seal(key, &Ack::domain(instance), &self.to_string())
    }

    /// Parses and verifies a value written by [`Ack::to_signed`] for `instance`.
    ///
    /// # Errors
    /// [`AckVerifyError::Signature`] when unsigned or not signed for this instance with this key;
    /// [`AckVerifyError::Malformed`] when the signed text is not an ack.
    pub fn parse_signed(s: &str, key: &[u8], instance: &str) -> Result<Ack, AckVerifyError> {
        let payload = crate::signing::unseal(key, &Ack::domain(instance), s)?;
        Ok(payload.parse()?)
    }
}

/// Why an acks-hash value was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AckVerifyError {
    #[error("ack signature: {0}")]
    Signature(#[from] crate::signing::UnsealError),
    #[error(transparent)]
    Malformed(#[from] AckParseError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_acks_round_trip_and_refuse_forgeries() {
        let a = Ack::Applied {
            epoch: 3,
            version: 1042,
            applied_at_ms: 17,
            entry: None,
        };
        let w = a.to_signed(b"key", "engine-a");
        assert!(w.starts_with("3:1042:17;sig="), "{w}");
        assert_eq!(Ack::parse_signed(&w, b"key", "engine-a"), Ok(a.clone()));
        assert!(matches!(
            Ack::parse_signed("3:1042:17", b"key", "engine-a"),
            Err(AckVerifyError::Signature(_))
        ));
        assert!(matches!(
            Ack::parse_signed(&w, b"key", "engine-b"),
            Err(AckVerifyError::Signature(_))
        ));
        let n = Ack::Refused {
            epoch: 3,
            version: 9,
            at_ms: 5,
            reason: "bad_signature".into(),
        };
        assert_eq!(
            Ack::parse_signed(&n.to_signed(b"key", "e"), b"key", "e"),
            Ok(n)
        );
        let junk = crate::signing::seal(b"key", "brownout-ack:e", "not an ack");
        assert!(matches!(
            Ack::parse_signed(&junk, b"key", "e"),
            Err(AckVerifyError::Malformed(_))
        ));
    }

    #[test]
    fn keys_share_one_hash_tag() {
        let k = RedisKeys::new("prod").unwrap();
        for key in [
            k.state(),
            k.notify(),
            k.log(),
            k.acks(),
            k.leader(),
            k.version_counter(),
        ] {
            assert!(key.starts_with("brownout:{prod}:"), "{key}");
        }
        assert_eq!(k.state(), "brownout:{prod}:state");
    }

    #[test]
    fn cluster_names_that_break_the_tag_are_refused() {
        for bad in ["", "a{b", "a}b", "a:b", "sp ace", &"x".repeat(65)] {
            assert!(RedisKeys::new(bad).is_err(), "{bad:?}");
        }
        assert!(RedisKeys::new("eu-west_1.a").is_ok());
    }

    #[test]
    fn acks_round_trip() {
        let a = Ack::Applied {
            epoch: 3,
            version: 1042,
            applied_at_ms: 17,
            entry: None,
        };
        assert_eq!(a.to_string(), "3:1042:17");
        assert_eq!("3:1042:17".parse::<Ack>().unwrap(), a);
        for (entry, text) in [
            ((true, false), "3:1042:17:entry=own"),
            ((false, true), "3:1042:17:entry=*"),
            ((true, true), "3:1042:17:entry=own+*"),
        ] {
            let a = Ack::Applied {
                epoch: 3,
                version: 1042,
                applied_at_ms: 17,
                entry: Some(EntryApplied {
                    own: entry.0,
                    default: entry.1,
                }),
            };
            assert_eq!(a.to_string(), text);
            assert_eq!(text.parse::<Ack>().unwrap(), a);
        }
        // A newer serving tier's extra key=value segments are skipped, not an error.
        assert!(matches!(
            "3:1042:17:entry=own:future=x".parse::<Ack>(),
            Ok(Ack::Applied {
                entry: Some(EntryApplied {
                    own: true,
                    default: false
                }),
                ..
            })
        ));
        assert!("3:1042:17:entry=nobody".parse::<Ack>().is_err());
        let n = Ack::Refused {
            epoch: 3,
            version: 9,
            at_ms: 5,
            reason: "bad signature: x:y".into(),
        };
        assert_eq!(n.to_string().parse::<Ack>().unwrap(), n);
        assert!("3:x:1".parse::<Ack>().is_err());
        assert!("1:2:3:4".parse::<Ack>().is_err());
    }

    #[test]
    fn notify_round_trips() {
        assert_eq!(parse_notify(&notify_payload(4, 99)), Some((4, 99)));
        assert_eq!(parse_notify("4"), None);
    }
}
