//! Bearer-token authentication: three separate tokens (ingest, read, admin), compared in
//! constant time. The admin token is also accepted wherever the read token is.
//!
//! [`middleware`] holds the axum layers that put routes behind them: [`require`] (one role),
//! [`require_ui`] / [`protect_ui`] (the read token, or the browser's login cookie) and
//! [`require_degrade_role`] (the role depends on the degradation route).

pub mod middleware;
pub mod reload;

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

/// One generation of the three tokens.
#[derive(Debug, Clone, Default)]
struct TokenSet {
    ingest: Option<Secret>,
    read: Option<Secret>,
    admin: Option<Secret>,
}

impl TokenSet {
    fn get(&self, role: Role) -> Option<&Secret> {
        match role {
            Role::Ingest => self.ingest.as_ref(),
            Role::Read => self.read.as_ref(),
            Role::Admin => self.admin.as_ref(),
        }
    }
    fn allows(&self, role: Role, presented: &str) -> bool {
        let eq = |s: Option<&Secret>| {
            s.is_some_and(|s| bool::from(s.expose().as_bytes().ct_eq(presented.as_bytes())))
        };
        match role {
            Role::Ingest => eq(self.ingest.as_ref()),
            Role::Read => eq(self.read.as_ref()) | eq(self.admin.as_ref()),
            Role::Admin => eq(self.admin.as_ref()),
        }
    }
}

#[derive(Debug, Default)]
struct Generations {
    current: TokenSet,
    /// The tokens replaced by the last [`Tokens::replace`], accepted until the instant given.
    previous: Option<(TokenSet, std::time::Instant)>,
}

/// The configured tokens. A missing token makes its routes refuse everyone (and `serve`
/// refuses to start without all three; see [`Config::require_tokens`]).
///
/// Clones share one state: [`Tokens::replace`] (a reload on SIGHUP or a changed token file,
/// [`reload`]) is seen by every route at once, and the replaced tokens stay accepted for the
/// overlap given, so clients switch without a restart and without a refused request.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    inner: std::sync::Arc<std::sync::RwLock<Generations>>,
}

impl Tokens {
    pub fn new(ingest: Option<Secret>, read: Option<Secret>, admin: Option<Secret>) -> Tokens {
        Tokens {
            inner: std::sync::Arc::new(std::sync::RwLock::new(Generations {
                current: TokenSet {
                    ingest,
                    read,
                    admin,
                },
                previous: None,
            })),
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

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Generations> {
        // A panic while holding the lock cannot leave the sets half-written (each is replaced
        // whole), so a poisoned lock is still consistent.
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current token of `role`.
    pub fn get(&self, role: Role) -> Option<Secret> {
        self.read().current.get(role).cloned()
    }

    /// Makes `new`'s tokens the current ones; the tokens they replace stay accepted for
    /// `overlap` (zero: refused at once). Returns the roles whose token changed.
    pub fn replace(&self, new: &Tokens, overlap: std::time::Duration) -> Vec<Role> {
        let next = new.read().current.clone();
        let mut g = self
            .inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let changed: Vec<Role> = [Role::Ingest, Role::Read, Role::Admin]
            .into_iter()
            .filter(|r| g.current.get(*r).map(Secret::expose) != next.get(*r).map(Secret::expose))
            .collect();
        if changed.is_empty() {
            return changed;
        }
        let old = std::mem::replace(&mut g.current, next);
        g.previous = (!overlap.is_zero()).then(|| (old, std::time::Instant::now() + overlap));
        changed
    }

    /// True when `presented` matches the token of `role` (or the admin token, for read), or
    /// the replaced one while its overlap lasts. Compares in constant time for equal lengths;
    /// lengths are not secret.
    pub fn allows(&self, role: Role, presented: &str) -> bool {
        let g = self.read();
        let prev = g.previous.as_ref().is_some_and(|(set, until)| {
            std::time::Instant::now() < *until && set.allows(role, presented)
        });
        g.current.allows(role, presented) | prev
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

/// 401 `unauthorized` in the API's error body (the error module knows nothing of auth).
impl From<AuthError> for crate::error::ApiError {
    fn from(e: AuthError) -> crate::error::ApiError {
        crate::error::ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", e.to_string())
    }
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
    fn replaced_tokens_are_accepted_for_the_overlap_only() {
        let t = tokens();
        let shared = t.clone();
        let next = Tokens::new(
            Some(Secret::new("ingest-new-aaaaaaaa")),
            Some(Secret::new("read-bbbbbbbbbbbbbb")),
            Some(Secret::new("admin-new-cccccccc")),
        );
        let changed = t.replace(&next, std::time::Duration::from_secs(3600));
        assert_eq!(changed, vec![Role::Ingest, Role::Admin]);
        // Every clone sees the new tokens, and the old ones during the overlap.
        assert!(shared.allows(Role::Ingest, "ingest-new-aaaaaaaa"));
        assert!(shared.allows(Role::Ingest, "ingest-aaaaaaaaaaaa"));
        assert!(shared.allows(Role::Admin, "admin-cccccccccccc"));
        assert_eq!(
            shared.get(Role::Admin).unwrap().expose(),
            "admin-new-cccccccc"
        );
        // No overlap: the old ones are refused at once.
        let t2 = tokens();
        t2.replace(&next, std::time::Duration::ZERO);
        assert!(!t2.allows(Role::Ingest, "ingest-aaaaaaaaaaaa"));
        assert!(t2.allows(Role::Ingest, "ingest-new-aaaaaaaa"));
        // A reload with nothing changed keeps the overlap of the last change.
        assert!(t.replace(&next, std::time::Duration::ZERO).is_empty());
        assert!(t.allows(Role::Ingest, "ingest-aaaaaaaaaaaa"));
    }

    #[test]
    fn unset_token_refuses_everyone() {
        let t = Tokens::default();
        assert!(!t.allows(Role::Ingest, ""));
        assert!(!t.allows(Role::Admin, "anything"));
    }
}
