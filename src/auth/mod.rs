//! Bearer-token authentication: three separate tokens (ingest, read, admin), compared in
//! constant time. The admin token is also accepted wherever the read token is.
//!
//! [`middleware`] holds the axum layers that put routes behind them: [`require`] (one role),
//! [`require_ui`] / [`protect_ui`] (the read token, or the browser's login cookie) and
//! [`require_degrade_role`] (the role depends on the degradation route).

pub mod middleware;

pub use middleware::{Guard, protect_ui, require, require_degrade_role, require_ui};

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::config::{Config, Secret};

/// Which token a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Ingest,
    Read,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Ingest => "ingest",
            Role::Read => "read",
            Role::Admin => "admin",
        }
    }
}

/// The configured tokens. A missing token makes its routes refuse everyone (and `serve`
/// refuses to start without all three; see [`Config::require_tokens`]).
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    ingest: Option<Secret>,
    read: Option<Secret>,
    admin: Option<Secret>,
}

impl Tokens {
    pub fn new(ingest: Option<Secret>, read: Option<Secret>, admin: Option<Secret>) -> Tokens {
        Tokens {
            ingest,
            read,
            admin,
        }
    }

    pub fn from_config(c: &Config) -> Tokens {
        Tokens::new(
            c.ingest_token.clone(),
            c.read_token.clone(),
            c.admin_token.clone(),
        )
    }

    /// Fresh random tokens (what `demo` uses and prints).
    pub fn random() -> Tokens {
        let make = || Secret::new(format!("bo_{}", uuid::Uuid::new_v4().simple()));
        Tokens::new(Some(make()), Some(make()), Some(make()))
    }

    pub fn get(&self, role: Role) -> Option<&Secret> {
        match role {
            Role::Ingest => self.ingest.as_ref(),
            Role::Read => self.read.as_ref(),
            Role::Admin => self.admin.as_ref(),
        }
    }

    /// True when `presented` matches the token of `role` (or the admin token, for read).
    /// Compares in constant time for equal lengths; lengths are not secret.
    pub fn allows(&self, role: Role, presented: &str) -> bool {
        let eq = |s: Option<&Secret>| {
            s.is_some_and(|s| bool::from(s.expose().as_bytes().ct_eq(presented.as_bytes())))
        };
        match role {
            Role::Ingest => eq(self.ingest.as_ref()),
            Role::Read => eq(self.read.as_ref()) | eq(self.admin.as_ref()),
            Role::Admin => eq(self.admin.as_ref()),
        }
    }

    /// Checks an `Authorization: Bearer <token>` header.
    ///
    /// # Errors
    /// [`AuthError`] saying whether the header was missing or the token wrong.
    pub fn check(&self, role: Role, headers: &HeaderMap) -> Result<(), AuthError> {
        let value = headers
            .get(header::AUTHORIZATION)
            .ok_or(AuthError::Missing(role))?;
        let value = value.to_str().map_err(|_| AuthError::Invalid(role))?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or(AuthError::Missing(role))?
            .trim();
        if self.allows(role, token) {
            Ok(())
        } else {
            Err(AuthError::Invalid(role))
        }
    }
}

/// A refused request. Always 401 with a `WWW-Authenticate` header.
#[derive(Debug, Clone, Copy, thiserror::Error)]
pub enum AuthError {
    #[error("missing `Authorization: Bearer <{}-token>` header", .0.as_str())]
    Missing(Role),
    #[error("the bearer token is not valid for {} access", .0.as_str())]
    Invalid(Role),
}

impl IntoResponse for AuthError {
    fn into_response(self) -> Response {
        let body =
            serde_json::json!({"error": {"code": "unauthorized", "message": self.to_string()}});
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer realm=\"brownout\"")],
            axum::Json(body),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        Tokens::new(
            Some(Secret::new("ingest-aaaaaaaaaaaa")),
            Some(Secret::new("read-bbbbbbbbbbbbbb")),
            Some(Secret::new("admin-cccccccccccc")),
        )
    }

    #[test]
    fn each_role_takes_its_own_token() {
        let t = tokens();
        let table = [
            (Role::Ingest, "ingest-aaaaaaaaaaaa", true),
            (Role::Ingest, "read-bbbbbbbbbbbbbb", false),
            (Role::Ingest, "admin-cccccccccccc", false),
            (Role::Read, "read-bbbbbbbbbbbbbb", true),
            (Role::Read, "admin-cccccccccccc", true),
            (Role::Read, "ingest-aaaaaaaaaaaa", false),
            (Role::Admin, "admin-cccccccccccc", true),
            (Role::Admin, "read-bbbbbbbbbbbbbb", false),
            (Role::Admin, "admin-ccccccccccc", false),
            (Role::Admin, "", false),
        ];
        for (role, tok, want) in table {
            assert_eq!(t.allows(role, tok), want, "{role:?} {tok}");
        }
    }

    #[test]
    fn header_forms() {
        let t = tokens();
        let mut h = HeaderMap::new();
        assert!(matches!(
            t.check(Role::Read, &h),
            Err(AuthError::Missing(_))
        ));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert!(matches!(
            t.check(Role::Read, &h),
            Err(AuthError::Missing(_))
        ));
        h.insert(header::AUTHORIZATION, "Bearer nope".parse().unwrap());
        assert!(matches!(
            t.check(Role::Read, &h),
            Err(AuthError::Invalid(_))
        ));
        h.insert(
            header::AUTHORIZATION,
            "Bearer read-bbbbbbbbbbbbbb".parse().unwrap(),
        );
        assert!(t.check(Role::Read, &h).is_ok());
    }

    #[test]
    fn unset_token_refuses_everyone() {
        let t = Tokens::default();
        assert!(!t.allows(Role::Ingest, ""));
        assert!(!t.allows(Role::Admin, "anything"));
    }
}
