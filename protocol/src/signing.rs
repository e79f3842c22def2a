//! HMAC-SHA256 signing of commands over their exact JSON bytes: the compatibility mode (the
//! default scheme, Ed25519, is in [`crate::command_keys`]), and the seals of other Redis values.
//!
//! The signature covers the bytes as published, not a re-serialisation, so a verifier never has
//! to agree with the signer on JSON formatting. It is written as lowercase hex. Verification uses
//! `hmac`'s constant-time comparison.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::command::Command;

type HmacSha256 = Hmac<Sha256>;

/// Why a signed command was refused.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("signature is not valid hex of 32 bytes")]
    MalformedSignature,
    #[error("signature does not match the command bytes (wrong key or tampered command)")]
    BadSignature,
    #[error("command JSON is invalid: {0}")]
    InvalidJson(#[from] serde_json::Error),
    #[error("command is for cluster {got:?}, this subscriber is in {expected:?}")]
    WrongCluster { expected: String, got: String },
    #[error("signature scheme {0} is not accepted here (see BROWNOUT_COMMAND_SIGNATURE)")]
    SchemeNotAccepted(&'static str),
    #[error("signed by key id {0:?}, which is not among the accepted public keys")]
    UnknownKey(String),
}

fn mac(key: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length; this cannot fail.
    HmacSha256::new_from_slice(key).expect("HMAC-SHA256 takes keys of any length")
}

/// Signs `bytes` with `key`; returns the lowercase hex HMAC-SHA256.
pub fn sign(key: &[u8], bytes: &[u8]) -> String {
    let mut m = mac(key);
    m.update(bytes);
    hex::encode(m.finalize().into_bytes())
}

/// Checks `sig_hex` against `bytes` in constant time.
///
/// # Errors
/// [`VerifyError::MalformedSignature`] when `sig_hex` is not 64 hex digits,
/// [`VerifyError::BadSignature`] when it does not match.
pub fn verify(key: &[u8], bytes: &[u8], sig_hex: &str) -> Result<(), VerifyError> {
    let sig = hex::decode(sig_hex.trim()).map_err(|_| VerifyError::MalformedSignature)?;
    if sig.len() != 32 {
        return Err(VerifyError::MalformedSignature);
    }
    let mut m = mac(key);
    m.update(bytes);
    m.verify_slice(&sig).map_err(|_| VerifyError::BadSignature)
}

/// The suffix that carries a sealed value's signature: `<payload>;sig=<64 hex>`.
pub const SEAL_SEPARATOR: &str = ";sig=";

fn sign_domain(key: &[u8], domain: &str, payload: &str) -> String {
    let mut m = mac(key);
    m.update(domain.as_bytes());
    m.update(b"\n");
    m.update(payload.as_bytes());
    hex::encode(m.finalize().into_bytes())
}

/// Seals a value kept in Redis other than a command (acks, the operator override): returns
/// `<payload>;sig=<hex>` where the HMAC covers `domain`, a newline, then the payload bytes. The
/// domain keeps a signature made for one purpose (or one instance) from verifying for another.
pub fn seal(key: &[u8], domain: &str, payload: &str) -> String {
    format!(
        "{payload}{SEAL_SEPARATOR}{}",
        sign_domain(key, domain, payload)
    )
}

/// Why a sealed value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsealError {
    #[error("value is not signed (no `;sig=` suffix)")]
    Unsigned,
    #[error("signature is not valid hex of 32 bytes")]
    MalformedSignature,
    #[error("signature does not match (wrong key, tampered value, or signed for another purpose)")]
    BadSignature,
}

/// Checks a value made by [`seal`] for the same `domain`; returns the payload.
///
/// # Errors
/// [`UnsealError`] when the suffix is missing, malformed, or does not verify.
pub fn unseal<'a>(key: &[u8], domain: &str, wire: &'a str) -> Result<&'a str, UnsealError> {
    let (payload, sig) = wire
        .rsplit_once(SEAL_SEPARATOR)
        .ok_or(UnsealError::Unsigned)?;
    let sig = hex::decode(sig).map_err(|_| UnsealError::MalformedSignature)?;
    if sig.len() != 32 {
        return Err(UnsealError::MalformedSignature);
    }
    let mut m = mac(key);
    m.update(domain.as_bytes());
    m.update(b"\n");
    m.update(payload.as_bytes());
    m.verify_slice(&sig)
        .map_err(|_| UnsealError::BadSignature)?;
    Ok(payload)
}

/// A command as it travels: its exact JSON text and the signature over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedCommand {
    pub json: String,
    pub sig: String,
}

impl SignedCommand {
    /// Serialises and signs `cmd`.
    pub fn sign(cmd: &Command, key: &[u8]) -> SignedCommand {
        let json = cmd.to_json();
        let sig = sign(key, json.as_bytes());
        SignedCommand { json, sig }
    }

    /// Verifies the signature over the exact bytes, then parses.
    ///
    /// # Errors
    /// Any [`VerifyError`]; the bytes are never parsed before the signature checks out.
    pub fn verify(&self, key: &[u8]) -> Result<Command, VerifyError> {
        verify(key, self.json.as_bytes(), &self.sig)?;
        Ok(serde_json::from_str(&self.json)?)
    }

    /// [`SignedCommand::verify`] plus a check that the command is for `cluster`.
    ///
    /// # Errors
    /// As [`SignedCommand::verify`], or [`VerifyError::WrongCluster`].
    pub fn verify_for(&self, key: &[u8], cluster: &str) -> Result<Command, VerifyError> {
        let c = self.verify(key)?;
        if c.cluster != cluster {
            return Err(VerifyError::WrongCluster {
                expected: cluster.into(),
                got: c.cluster,
            });
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_verify_only_for_their_key_domain_and_bytes() {
        let w = seal(b"k1", "brownout-ack:engine-a", "3:1042:17");
        assert!(w.starts_with("3:1042:17;sig="), "{w}");
        assert_eq!(unseal(b"k1", "brownout-ack:engine-a", &w), Ok("3:1042:17"));
        assert_eq!(
            unseal(b"k2", "brownout-ack:engine-a", &w),
            Err(UnsealError::BadSignature)
        );
        // Copied to another instance's field: refused.
        assert_eq!(
            unseal(b"k1", "brownout-ack:engine-b", &w),
            Err(UnsealError::BadSignature)
        );
        let tampered = w.replacen("1042", "1043", 1);
        assert_eq!(
            unseal(b"k1", "brownout-ack:engine-a", &tampered),
            Err(UnsealError::BadSignature)
        );
        assert_eq!(
            unseal(b"k1", "brownout-ack:engine-a", "3:1042:17"),
            Err(UnsealError::Unsigned)
        );
        assert_eq!(
            unseal(b"k1", "brownout-ack:engine-a", "3:1042:17;sig=zz"),
            Err(UnsealError::MalformedSignature)
        );
        // A payload that itself contains the separator still round-trips (the last one splits).
        let odd = seal(b"k1", "d", "a;sig=b");
        assert_eq!(unseal(b"k1", "d", &odd), Ok("a;sig=b"));
    }

    // Known answer. The key is the ASCII string below; the command is fixtures/command_t2.json
    // byte for byte; the signature was computed independently with
    //   openssl dgst -sha256 -hmac 'brownout-test-key-0001' -r protocol/fixtures/command_t2.json
    const KEY: &[u8] = b"brownout-test-key-0001";
    const JSON: &str = include_str!("../fixtures/command_t2.json");
    const SIG: &str = include_str!("../fixtures/command_t2.sig");

    #[test]
    fn known_answer_signature_matches_fixture() {
        assert_eq!(sign(KEY, JSON.as_bytes()), SIG.trim());
        verify(KEY, JSON.as_bytes(), SIG).unwrap();
    }

    #[test]
    fn flipping_any_byte_fails_verification() {
        let bytes = JSON.as_bytes();
        for i in 0..bytes.len() {
            let mut t = bytes.to_vec();
            t[i] ^= 0x01;
            assert!(
                matches!(verify(KEY, &t, SIG), Err(VerifyError::BadSignature)),
                "byte {i} flipped still verified"
            );
        }
    }

    #[test]
    fn tampered_signature_or_wrong_key_fails() {
        let mut s = SIG.trim().to_string();
        let last = if s.ends_with('0') { '1' } else { '0' };
        s.pop();
        s.push(last);
        assert!(matches!(
            verify(KEY, JSON.as_bytes(), &s),
            Err(VerifyError::BadSignature)
        ));
        assert!(matches!(
            verify(b"other", JSON.as_bytes(), SIG),
            Err(VerifyError::BadSignature)
        ));
        assert!(matches!(
            verify(KEY, JSON.as_bytes(), "zz"),
            Err(VerifyError::MalformedSignature)
        ));
        assert!(matches!(
            verify(KEY, JSON.as_bytes(), "abcd"),
            Err(VerifyError::MalformedSignature)
        ));
    }

    #[test]
    fn signed_command_round_trips_and_checks_cluster() {
        let c: Command = serde_json::from_str(JSON).unwrap();
        let s = SignedCommand::sign(&c, KEY);
        assert_eq!(s.verify(KEY).unwrap(), c);
        assert!(matches!(
            s.verify_for(KEY, "staging"),
            Err(VerifyError::WrongCluster { .. })
        ));
        let forged = SignedCommand {
            json: s.json.replace("\"tier\":2", "\"tier\":0"),
            sig: s.sig,
        };
        assert!(matches!(forged.verify(KEY), Err(VerifyError::BadSignature)));
    }

    #[test]
    fn garbage_with_valid_signature_is_an_error_not_a_panic() {
        let junk = "{\"cluster\": 5";
        let s = SignedCommand {
            json: junk.into(),
            sig: sign(KEY, junk.as_bytes()),
        };
        assert!(matches!(s.verify(KEY), Err(VerifyError::InvalidJson(_))));
    }
}
