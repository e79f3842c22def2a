//! TLS settings of the control plane: its listeners' certificates, and the client side of
//! ClickHouse over `https://`.

use std::path::PathBuf;
use std::sync::Arc;

use super::ConfigError;

/// The listeners' TLS (`server.tls_cert_file`, `server.tls_key_file`, `server.tls_client_ca_file`):
/// the 8080 UI/API/ingest listener serves the certificate to any client; the OTLP listeners
/// (4318, 4317) also require a client certificate of `tls_client_ca_file` when it is set.
#[derive(Debug, Clone)]
pub struct ListenerTls {
    /// For `server.http_addr` (browsers: no client certificate asked for).
    pub web: Arc<brownout_net::Tls>,
    /// For `server.otlp_http_addr` and `server.otlp_grpc_addr`.
    pub ingest: Arc<brownout_net::Tls>,
}

pub(super) fn listener_tls(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
    field_err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<Option<ListenerTls>, ConfigError> {
    let Some((cert, key)) = pair(
        cert,
        key,
        ("server.tls_cert_file", "server.tls_key_file"),
        field_err,
    )?
    else {
        if client_ca.is_some() {
            return Err(field_err(
                "server.tls_client_ca_file",
                "needs server.tls_cert_file and server.tls_key_file".into(),
            ));
        }
        return Ok(None);
    };
    let load = |client_ca: Option<PathBuf>, field: &str| {
        brownout_net::Tls::load(brownout_net::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca,
        })
        .map_err(|e| field_err(field, e.to_string()))
    };
    let web = load(None, "server.tls_cert_file")?;
    let ingest = match client_ca {
        None => Arc::clone(&web),
        Some(ca) => load(Some(ca), "server.tls_client_ca_file")?,
    };
    Ok(Some(ListenerTls { web, ingest }))
}

/// ClickHouse's client TLS (`storage.clickhouse_ca_file`, `storage.clickhouse_client_cert_file`,
/// `storage.clickhouse_client_key_file`, or `CLICKHOUSE_CA_FILE`, `CLICKHOUSE_CLIENT_CERT_FILE`,
/// `CLICKHOUSE_CLIENT_KEY_FILE`): read once at start. `None` when none is set.
pub(super) fn clickhouse_tls(
    url: &str,
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    field_err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<Option<Arc<rustls::ClientConfig>>, ConfigError> {
    let client = pair(
        cert,
        key,
        (
            "storage.clickhouse_client_cert_file",
            "storage.clickhouse_client_key_file",
        ),
        field_err,
    )?;
    if ca.is_none() && client.is_none() {
        return Ok(None);
    }
    let field = if ca.is_some() {
        "storage.clickhouse_ca_file"
    } else {
        "storage.clickhouse_client_cert_file"
    };
    if !url.starts_with("https://") {
        return Err(field_err(
            field,
            format!("set for {url:?}: TLS files need an https:// URL"),
        ));
    }
    brownout_net::client_config(
        ca.as_deref(),
        client.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
    )
    .map(|c| Some(Arc::new(c)))
    .map_err(|e| field_err(field, e.to_string()))
}

/// A certificate and its key: both, or neither (`fields`: their names, for the error).
fn pair(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    (cert_field, key_field): (&str, &str),
    field_err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<Option<(PathBuf, PathBuf)>, ConfigError> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(c), Some(k)) => Ok(Some((c, k))),
        (Some(_), None) => Err(field_err(
            key_field,
            format!("missing: {cert_field} needs its key"),
        )),
        (None, Some(_)) => Err(field_err(
            cert_field,
            format!("missing: {key_field} needs its certificate"),
        )),
    }
}
