//! HMAC-SHA256 signing of commands over their exact JSON bytes.
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
