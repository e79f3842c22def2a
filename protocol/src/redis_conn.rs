//! One way to turn a Redis URL into a client, for every process.
//!
//! - `redis://[user:password@]host:port/db` — password or ACL user, as the redis crate parses it.
//! - `rediss://…` — TLS (rustls). The server certificate is checked against the system roots,
//!   or against the PEM file in `BROWNOUT_REDIS_CA_FILE` (a private CA). For mutual TLS set
//!   `BROWNOUT_REDIS_CLIENT_CERT_FILE` and `BROWNOUT_REDIS_CLIENT_KEY_FILE` (PEM) as well.
//!
//! - `redis+sentinel://…` — the master found through Sentinel: not a single client, see
//!   [`crate::redis_ha::RedisTarget`] (which every long-lived process uses).
//!
//! Building a client does no IO beyond reading those files; connecting is the caller's.

use std::path::Path;

/// Environment variable: PEM file with the CA that signed the Redis server's certificate.
pub const ENV_CA_FILE: &str = "BROWNOUT_REDIS_CA_FILE";
/// Environment variable: PEM client certificate for mutual TLS.
pub const ENV_CLIENT_CERT_FILE: &str = "BROWNOUT_REDIS_CLIENT_CERT_FILE";
/// Environment variable: PEM private key of that client certificate.
pub const ENV_CLIENT_KEY_FILE: &str = "BROWNOUT_REDIS_CLIENT_KEY_FILE";

/// TLS material beyond the URL (all PEM bytes).
#[derive(Default, Clone)]
pub struct RedisTls {
    pub ca: Option<Vec<u8>>,
    pub client_cert_and_key: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.is_some())
            .field("client_cert", &self.client_cert_and_key.is_some())
            .finish()
    }
}

fn read(var: &str) -> redis::RedisResult<Option<Vec<u8>>> {
    let Some(path) = std::env::var_os(var).filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    std::fs::read(Path::new(&path)).map(Some).map_err(|e| {
        redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "cannot read a Redis TLS file",
            format!("{var}={}: {e}", Path::new(&path).display()),
        ))
    })
}

impl RedisTls {
    /// From `BROWNOUT_REDIS_CA_FILE`, `BROWNOUT_REDIS_CLIENT_CERT_FILE` and
    /// `BROWNOUT_REDIS_CLIENT_KEY_FILE`.
    ///
    /// # Errors
    /// A named file cannot be read, or only one of the client certificate and key is set.
    pub fn from_env() -> redis::RedisResult<RedisTls> {
        let ca = read(ENV_CA_FILE)?;
        let client_cert_and_key = match (read(ENV_CLIENT_CERT_FILE)?, read(ENV_CLIENT_KEY_FILE)?) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "mutual TLS needs both BROWNOUT_REDIS_CLIENT_CERT_FILE and BROWNOUT_REDIS_CLIENT_KEY_FILE",
                )));
            }
        };
        Ok(RedisTls {
            ca,
            client_cert_and_key,
        })
    }
}

/// A client for `url`, with TLS files from the environment when the URL is `rediss://`.
///
/// # Errors
/// A malformed URL, an unreadable TLS file, or TLS files given for a plain `redis://` URL.
pub fn redis_client(url: &str) -> redis::RedisResult<redis::Client> {
    redis_client_with(url, &RedisTls::from_env()?)
}

/// [`redis_client`] with explicit TLS material.
///
/// # Errors
/// As [`redis_client`].
pub fn redis_client_with(url: &str, tls: &RedisTls) -> redis::RedisResult<redis::Client> {
    if url.starts_with(crate::redis_ha::SENTINEL_SCHEME) {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "a redis+sentinel:// URL names no single node: resolve it with RedisTarget",
        )));
    }
    let has_files = tls.ca.is_some() || tls.client_cert_and_key.is_some();
    if !has_files {
        return redis::Client::open(url);
    }
    if !url.starts_with("rediss://") {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "Redis TLS files are set but the URL is not rediss://",
        )));
    }
    redis::Client::build_with_tls(
        url,
        redis::TlsCertificates {
            client_tls: tls
                .client_cert_and_key
                .clone()
                .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }),
            root_cert: tls.ca.clone(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_urls_with_passwords_parse_and_tls_files_need_rediss() {
        let c =
            redis_client_with("redis://app:s3cret@127.0.0.1:6380/2", &RedisTls::default()).unwrap();
        let info = c.get_connection_info();
        assert_eq!(info.redis_settings().username(), Some("app"));
        assert_eq!(info.redis_settings().password(), Some("s3cret"));
        let tls = RedisTls {
            ca: Some(b"-----BEGIN CERTIFICATE-----".to_vec()),
            client_cert_and_key: None,
        };
        let e = redis_client_with("redis://127.0.0.1:6379", &tls).unwrap_err();
        assert!(e.to_string().contains("not rediss://"), "{e}");
        assert!(!format!("{tls:?}").contains("BEGIN"));
    }
}
