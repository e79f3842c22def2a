//! Who may sign commands, and who may ack them (docs/PROTOCOL.md "Signatures", docs/SECURITY.md).
//!
//! By default the control plane signs every command with an **Ed25519 private key** that only it
//! holds; engines, proxies and agents hold public keys only ([`CommandVerifier`]), several at once,
//! each selected by the key id carried in the signature, so a key rotates without downtime: add
//! the new public key to the verifiers, switch the control plane to the new private key, then
//! drop the old public key. A serving host that is compromised holds nothing that signs a command.
//!
//! The signature field of an Ed25519-signed command reads `ed25519:<key id>:<128 hex>`; the key
//! id is the first 16 hex digits of SHA-256 over the 32-byte public key, and the signature covers
//! `brownout-command-ed25519\n<key id>\n` followed by the command's exact JSON bytes (so the key id
//! is signed too, and a signature made for another purpose never verifies as a command).
//!
//! Acks are sealed with a **per-engine** HMAC key, `HMAC-SHA256(ack master, "brownout-ack-key\n" +
//! instance id)`: the control plane holds the ack master and derives any engine's key to verify;
//! an engine holds its own key only, which seals acks for that instance id and nothing else (not
//! another instance's ack, and never a command: commands are Ed25519).
//!
//! The **HMAC compatibility mode** ([`CommandSigner::Hmac`], [`CommandVerifier::hmac`]) is the
//! scheme of earlier releases: one shared key signs commands (64 hex digits of HMAC-SHA256 over
//! the JSON bytes) and seals acks. It is off unless chosen explicitly
//! (`BROWNOUT_COMMAND_SIGNATURE=hmac`). A verifier of one scheme refuses the other's signatures,
//! so an older subscriber (HMAC only) refuses an Ed25519-signed command as a malformed signature.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ed25519_dalek::{Signer as _, SigningKey, Verifier as _, VerifyingKey};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::command::Command;
use crate::signing::{SignedCommand, VerifyError};

/// The prefix of an Ed25519 command signature and of a written public key.
pub const ED25519_PREFIX: &str = "ed25519:";
/// The domain an Ed25519 command signature covers before the key id and the JSON bytes.
const COMMAND_DOMAIN: &[u8] = b"brownout-command-ed25519\n";

/// Environment: `ed25519` (the default) or `hmac` (the compatibility mode).
pub const SIGNATURE_ENV: &str = "BROWNOUT_COMMAND_SIGNATURE";
/// Environment: accepted command public keys, comma- or whitespace-separated.
pub const PUBKEY_ENV: &str = "BROWNOUT_COMMAND_PUBKEY";
/// Environment: a file of accepted command public keys, one a line (`#` comments). Read again
/// when it changes (checked at most once a second, when a command is verified) and on
/// [`request_key_reload`] (SIGHUP); a key dropped from it stays accepted for
/// [`PUBKEY_OVERLAP_ENV`].
pub const PUBKEY_FILE_ENV: &str = "BROWNOUT_COMMAND_PUBKEY_FILE";
/// Environment: seconds a public key removed from the key file stays accepted (default 300).
pub const PUBKEY_OVERLAP_ENV: &str = "BROWNOUT_COMMAND_PUBKEY_OVERLAP_S";
/// The default of [`PUBKEY_OVERLAP_ENV`].
pub const DEFAULT_PUBKEY_OVERLAP: std::time::Duration = std::time::Duration::from_secs(300);
/// Environment: the control plane's private signing key file (64 hex digits, the seed).
pub const SIGNING_KEY_FILE_ENV: &str = "BROWNOUT_COMMAND_SIGNING_KEY_FILE";
/// Environment: an engine's own ack key (64 hex digits), or `_FILE` naming a file holding it.
pub const ACK_KEY_ENV: &str = "BROWNOUT_ACK_KEY";
/// Environment: a file holding the engine's own ack key (64 hex digits), as
/// `brownout keys ack-key --out` writes it.
pub const ACK_KEY_FILE_ENV: &str = "BROWNOUT_ACK_KEY_FILE";
/// Environment: the control plane's ack master key file (64 hex digits).
pub const ACK_MASTER_FILE_ENV: &str = "BROWNOUT_ACK_MASTER_KEY_FILE";

/// File names in the control plane's data directory (`BROWNOUT_DATA_DIR`, default `./data`).
pub const SIGNING_KEY_FILE: &str = "command-signing.key";
/// The public half, written next to the private key for verifiers on the same host.
pub const PUBLIC_KEY_FILE: &str = "command-signing.pub";
/// The ack master, generated with the signing key.
pub const ACK_MASTER_FILE: &str = "ack-master.key";

/// The data directory every binary defaults to (`BROWNOUT_DATA_DIR`, else `./data`).
pub fn default_data_dir() -> PathBuf {
    std::env::var_os("BROWNOUT_DATA_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from("./data"), PathBuf::from)
}

/// A key that does not parse or cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("public key {0:?} is not `ed25519:<64 hex>` (32 bytes)")]
    PublicKey(String),
    #[error("private key in {0} is not 64 hex digits (a 32-byte Ed25519 seed)")]
    PrivateKey(String),
    #[error("key {0:?} is not 64 hex digits (32 bytes)")]
    Secret(String),
    #[error("{0}: {1}")]
    Io(String, String),
    #[error("{0} must be `ed25519` or `hmac`, not {1:?}")]
    Scheme(&'static str, String),
    #[error("no public key listed")]
    NoPublicKey,
}

fn io_err(p: &Path, e: &std::io::Error) -> KeyError {
    KeyError::Io(p.display().to_string(), e.to_string())
}

fn key_id(public: &VerifyingKey) -> String {
    let h = Sha256::digest(public.as_bytes());
    hex::encode(&h[..8])
}

fn hex32(s: &str) -> Option<[u8; 32]> {
    let b = hex::decode(s.trim()).ok()?;
    b.try_into().ok()
}

/// An Ed25519 public key that verifies commands, with its key id.
#[derive(Clone, PartialEq, Eq)]
pub struct CommandPublicKey {
    key: VerifyingKey,
    id: String,
}

impl CommandPublicKey {
    /// Parses `ed25519:<64 hex>` (the prefix may be left out).
    ///
    /// # Errors
    /// [`KeyError::PublicKey`] when it is not 32 bytes of hex or not a valid curve point.
    pub fn parse(s: &str) -> Result<CommandPublicKey, KeyError> {
        let t = s.trim();
        let hex_part = t.strip_prefix(ED25519_PREFIX).unwrap_or(t);
        let bytes = hex32(hex_part).ok_or_else(|| KeyError::PublicKey(t.into()))?;
        let key = VerifyingKey::from_bytes(&bytes).map_err(|_| KeyError::PublicKey(t.into()))?;
        Ok(CommandPublicKey {
            id: key_id(&key),
            key,
        })
    }
    /// The key id carried in signatures made by the matching private key.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Display for CommandPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{ED25519_PREFIX}{}", hex::encode(self.key.as_bytes()))
    }
}

impl fmt::Debug for CommandPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CommandPublicKey({} id {})", self, self.id)
    }
}

/// Parses a list of public keys: separated by commas, whitespace or newlines; `#` starts a
/// comment that runs to the end of its line.
///
/// # Errors
/// The first key that does not parse.
pub fn parse_public_keys(text: &str) -> Result<Vec<CommandPublicKey>, KeyError> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        for k in line.split(|c: char| c == ',' || c.is_whitespace()) {
            if !k.is_empty() {
                out.push(CommandPublicKey::parse(k)?);
            }
        }
    }
    Ok(out)
}

/// The control plane's Ed25519 private key.
#[derive(Clone)]
pub struct CommandSigningKey {
    key: SigningKey,
    id: String,
}

impl fmt::Debug for CommandSigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CommandSigningKey(id {}, private half redacted)",
            self.id
        )
    }
}

impl CommandSigningKey {
    /// From the 32-byte seed.
    pub fn from_seed(seed: &[u8; 32]) -> CommandSigningKey {
        let key = SigningKey::from_bytes(seed);
        CommandSigningKey {
            id: key_id(&key.verifying_key()),
            key,
        }
    }
    /// A fresh key from the operating system's random source.
    pub fn generate() -> CommandSigningKey {
        CommandSigningKey::from_seed(&rand::random::<[u8; 32]>())
    }
    /// The public half.
    pub fn public(&self) -> CommandPublicKey {
        CommandPublicKey {
            key: self.key.verifying_key(),
            id: self.id.clone(),
        }
    }
    pub fn id(&self) -> &str {
        &self.id
    }
    /// The seed as 64 hex digits (what a key file holds).
    pub fn seed_hex(&self) -> String {
        hex::encode(self.key.to_bytes())
    }

    /// Reads a key file (64 hex digits, surrounding whitespace ignored).
    ///
    /// # Errors
    /// [`KeyError::Io`] when unreadable, [`KeyError::PrivateKey`] when not a seed.
    pub fn load(path: &Path) -> Result<CommandSigningKey, KeyError> {
        let text = std::fs::read_to_string(path).map_err(|e| io_err(path, &e))?;
        let seed = hex32(&text).ok_or_else(|| KeyError::PrivateKey(path.display().to_string()))?;
        Ok(CommandSigningKey::from_seed(&seed))
    }

    /// Derives the key that seals the control plane's own values in Redis (the operator
    /// override): every replica holding this private key derives the same one; no engine can.
    pub fn seal_key(&self) -> Vec<u8> {
        hmac_derive(&self.key.to_bytes(), b"brownout-plane-seal-v1")
    }
}

fn hmac_derive(key: &[u8], label: &[u8]) -> Vec<u8> {
    let mut m = <Hmac<Sha256>>::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(label);
    m.finalize().into_bytes().to_vec()
}

/// Writes `text` to a new file `path` with mode 0600 and syncs it; fails if `path` exists.
///
/// # Errors
/// [`KeyError::Io`] when the file exists or cannot be written.
pub fn write_private(path: &Path, text: &str) -> Result<(), KeyError> {
    use std::io::Write as _;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    let mut f = o.open(path).map_err(|e| io_err(path, &e))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| io_err(path, &e))
}

/// The key files of a control plane's data directory, generated on first start.
#[derive(Debug, Clone)]
pub struct DataDirKeys {
    pub signing: CommandSigningKey,
    pub ack_master: Vec<u8>,
    /// Whether this call generated them (first start).
    pub created: bool,
}

/// Loads `command-signing.key` and `ack-master.key` from `dir`, generating both (mode 0600, and
/// `command-signing.pub` next to them) when the signing key is missing.
///
/// # Errors
/// [`KeyError`] when the directory cannot be created or a file is unreadable or malformed.
pub fn load_or_create_in(dir: &Path) -> Result<DataDirKeys, KeyError> {
    let sk = dir.join(SIGNING_KEY_FILE);
    let am = dir.join(ACK_MASTER_FILE);
    let mut created = false;
    if !sk.exists() {
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, &e))?;
        let k = CommandSigningKey::generate();
        match write_private(&sk, &format!("{}\n", k.seed_hex())) {
            Ok(()) => created = true,
            // Another replica sharing this directory won the race: use its key.
            Err(_) if sk.exists() => {}
            Err(e) => return Err(e),
        }
    }
    let signing = CommandSigningKey::load(&sk)?;
    let pubf = dir.join(PUBLIC_KEY_FILE);
    let pub_text = format!("{}\n", signing.public());
    if std::fs::read_to_string(&pubf).ok().as_deref() != Some(pub_text.as_str()) {
        std::fs::write(&pubf, &pub_text).map_err(|e| io_err(&pubf, &e))?;
    }
    if !am.exists() {
        let _ = write_private(
            &am,
            &format!("{}\n", hex::encode(rand::random::<[u8; 32]>())),
        );
    }
    let ack_master = read_secret_file(&am)?;
    Ok(DataDirKeys {
        signing,
        ack_master,
        created,
    })
}

/// Reads a 64-hex-digit secret from a file.
///
/// # Errors
/// [`KeyError`] when unreadable or not 32 bytes of hex.
pub fn read_secret_file(path: &Path) -> Result<Vec<u8>, KeyError> {
    let text = std::fs::read_to_string(path).map_err(|e| io_err(path, &e))?;
    parse_secret(&text)
}

/// Parses a 64-hex-digit secret.
///
/// # Errors
/// [`KeyError::Secret`] when not 32 bytes of hex.
pub fn parse_secret(text: &str) -> Result<Vec<u8>, KeyError> {
    hex32(text).map(|b| b.to_vec()).ok_or_else(|| {
        KeyError::Secret(format!(
            "{}…",
            text.trim().chars().take(8).collect::<String>()
        ))
    })
}

/// Signs commands: the control plane's Ed25519 key, or the HMAC compatibility key.
#[derive(Clone)]
pub enum CommandSigner {
    Ed25519(CommandSigningKey),
    /// Compatibility mode: the shared HMAC key of earlier releases.
    Hmac(Vec<u8>),
}

impl fmt::Debug for CommandSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommandSigner::Ed25519(k) => write!(f, "{k:?}"),
            CommandSigner::Hmac(_) => f.write_str("CommandSigner::Hmac(redacted)"),
        }
    }
}

impl CommandSigner {
    /// Serialises and signs `cmd`.
    pub fn sign(&self, cmd: &Command) -> SignedCommand {
        let json = cmd.to_json();
        let sig = self.sign_bytes(json.as_bytes());
        SignedCommand { json, sig }
    }
    /// The signature field for exactly these JSON bytes.
    pub fn sign_bytes(&self, json: &[u8]) -> String {
        match self {
            CommandSigner::Hmac(k) => crate::signing::sign(k, json),
            CommandSigner::Ed25519(k) => {
                let mut msg = Vec::with_capacity(COMMAND_DOMAIN.len() + 17 + json.len());
                msg.extend_from_slice(COMMAND_DOMAIN);
                msg.extend_from_slice(k.id.as_bytes());
                msg.push(b'\n');
                msg.extend_from_slice(json);
                let s = k.key.sign(&msg);
                format!("{ED25519_PREFIX}{}:{}", k.id, hex::encode(s.to_bytes()))
            }
        }
    }
    /// The verifier that accepts this signer's commands (and nothing else).
    pub fn verifier(&self) -> CommandVerifier {
        match self {
            CommandSigner::Hmac(k) => CommandVerifier::hmac(k),
            CommandSigner::Ed25519(k) => CommandVerifier::ed25519([k.public()]),
        }
    }
}

impl<const N: usize> From<&[u8; N]> for CommandSigner {
    /// An HMAC (compatibility mode) signer.
    fn from(k: &[u8; N]) -> CommandSigner {
        CommandSigner::Hmac(k.to_vec())
    }
}
impl From<&[u8]> for CommandSigner {
    fn from(k: &[u8]) -> CommandSigner {
        CommandSigner::Hmac(k.to_vec())
    }
}
impl From<Vec<u8>> for CommandSigner {
    fn from(k: Vec<u8>) -> CommandSigner {
        CommandSigner::Hmac(k)
    }
}
impl From<&Vec<u8>> for CommandSigner {
    fn from(k: &Vec<u8>) -> CommandSigner {
        CommandSigner::Hmac(k.clone())
    }
}
impl From<&CommandSigner> for CommandSigner {
    fn from(s: &CommandSigner) -> CommandSigner {
        s.clone()
    }
}
impl From<CommandSigningKey> for CommandSigner {
    fn from(k: CommandSigningKey) -> CommandSigner {
        CommandSigner::Ed25519(k)
    }
}

/// Verifies commands: a set of Ed25519 public keys by key id, or the HMAC compatibility key.
#[derive(Clone, Default)]
pub struct CommandVerifier {
    keys: BTreeMap<String, VerifyingKey>,
    hmac: Option<Vec<u8>>,
    /// Keys from a file, read again when it changes (shared by the clones).
    file: Option<Arc<KeyFile>>,
}

/// Bumped by [`request_key_reload`]: every key file is read again at its next use.
static RELOAD_GENERATION: AtomicU64 = AtomicU64::new(0);

/// Asks every [`CommandVerifier`] with a key file to read it again at its next verification
/// (the serving tier calls this on SIGHUP).
pub fn request_key_reload() {
    RELOAD_GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// A public-key file and what was last read from it.
struct KeyFile {
    path: PathBuf,
    overlap: Duration,
    state: Mutex<KeyFileState>,
}

struct KeyFileState {
    checked: Instant,
    generation: u64,
    text: String,
    keys: BTreeMap<String, VerifyingKey>,
    /// Keys dropped from the file, accepted until the instant given.
    retired: BTreeMap<String, (VerifyingKey, Instant)>,
}

/// How often a key file is compared with what was read (at most; only when a command arrives).
const KEY_FILE_CHECK: Duration = Duration::from_secs(1);

impl KeyFile {
    /// The key `id`, after reading the file again if it is due.
    fn get(&self, id: &str) -> Option<VerifyingKey> {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let generation = RELOAD_GENERATION.load(Ordering::Relaxed);
        let now = Instant::now();
        if generation != st.generation || now.duration_since(st.checked) >= KEY_FILE_CHECK {
            st.generation = generation;
            st.checked = now;
            self.reread(&mut st, now);
        }
        st.retired.retain(|_, (_, until)| *until > now);
        st.keys
            .get(id)
            .copied()
            .or_else(|| st.retired.get(id).map(|(k, _)| *k))
    }

    fn reread(&self, st: &mut KeyFileState, now: Instant) {
        let text = match read_small(&self.path) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "command public-key file unreadable; the keys read before stay in use");
                return;
            }
        };
        if text == st.text {
            return;
        }
        let keys: BTreeMap<String, VerifyingKey> = match parse_public_keys(&text) {
            Ok(v) => v.into_iter().map(|k| (k.id, k.key)).collect(),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "command public-key file does not parse; the keys read before stay in use");
                return;
            }
        };
        let until = now + self.overlap;
        for (id, k) in &st.keys {
            if !keys.contains_key(id) {
                st.retired.insert(id.clone(), (*k, until));
            }
        }
        for id in keys.keys() {
            st.retired.remove(id);
        }
        tracing::info!(
            path = %self.path.display(),
            key_ids = ?keys.keys().collect::<Vec<_>>(),
            retired = ?st.retired.keys().collect::<Vec<_>>(),
            overlap_s = self.overlap.as_secs(),
            "command public keys reloaded"
        );
        st.text = text;
        st.keys = keys;
    }
}

/// A key file's text, at most 1 MiB.
fn read_small(path: &Path) -> Result<String, KeyError> {
    use std::io::Read as _;
    let f = std::fs::File::open(path).map_err(|e| io_err(path, &e))?;
    let mut s = String::new();
    f.take(1 << 20)
        .read_to_string(&mut s)
        .map_err(|e| io_err(path, &e))?;
    Ok(s)
}

impl fmt::Debug for CommandVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandVerifier")
            .field("ed25519_key_ids", &self.keys.keys().collect::<Vec<_>>())
            .field("hmac", &self.hmac.is_some())
            .finish()
    }
}

impl CommandVerifier {
    /// Accepts commands signed by any of `keys` (Ed25519 only).
    pub fn ed25519(keys: impl IntoIterator<Item = CommandPublicKey>) -> CommandVerifier {
        CommandVerifier {
            keys: keys.into_iter().map(|k| (k.id, k.key)).collect(),
            hmac: None,
            file: None,
        }
    }
    /// Compatibility mode: accepts HMAC-SHA256 signatures with `key` only.
    pub fn hmac(key: &[u8]) -> CommandVerifier {
        CommandVerifier {
            keys: BTreeMap::new(),
            hmac: Some(key.to_vec()),
            file: None,
        }
    }
    /// Also accepts the keys of the file at `path` (one a line), read now and again whenever it
    /// changes (compared at most once a second, when a command is verified, and at once after
    /// [`request_key_reload`]). A key dropped from the file stays accepted for `overlap`; a file
    /// that becomes unreadable or malformed leaves the keys read before in use.
    ///
    /// # Errors
    /// The file cannot be read or does not parse now.
    pub fn with_key_file(
        mut self,
        path: &Path,
        overlap: Duration,
    ) -> Result<CommandVerifier, KeyError> {
        let text = read_small(path)?;
        let keys = parse_public_keys(&text)?
            .into_iter()
            .map(|k| (k.id, k.key))
            .collect();
        self.file = Some(Arc::new(KeyFile {
            path: path.to_path_buf(),
            overlap,
            state: Mutex::new(KeyFileState {
                checked: Instant::now(),
                generation: RELOAD_GENERATION.load(Ordering::Relaxed),
                text,
                keys,
                retired: BTreeMap::new(),
            }),
        }));
        Ok(self)
    }
    /// Adds an accepted public key (rotation: old and new accepted together).
    pub fn add(&mut self, k: CommandPublicKey) {
        self.keys.insert(k.id, k.key);
    }
    /// The accepted key ids: the fixed ones, then the key file's as last read (without the
    /// retired ones still in their overlap).
    pub fn key_ids(&self) -> Vec<String> {
        let mut v: Vec<String> = self.keys.keys().cloned().collect();
        if let Some(f) = &self.file {
            let st = f
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            v.extend(
                st.keys
                    .keys()
                    .filter(|k| !self.keys.contains_key(*k))
                    .cloned(),
            );
        }
        v
    }
    pub fn is_hmac(&self) -> bool {
        self.hmac.is_some()
    }

    /// Checks the signature over the exact bytes, then parses.
    ///
    /// # Errors
    /// [`VerifyError`]; the bytes are never parsed before the signature checks out.
    pub fn verify(&self, s: &SignedCommand) -> Result<Command, VerifyError> {
        self.verify_bytes(s.json.as_bytes(), &s.sig)?;
        Ok(serde_json::from_str(&s.json)?)
    }

    /// [`CommandVerifier::verify`] plus a check that the command is for `cluster`.
    ///
    /// # Errors
    /// As [`CommandVerifier::verify`], or [`VerifyError::WrongCluster`].
    pub fn verify_for(&self, s: &SignedCommand, cluster: &str) -> Result<Command, VerifyError> {
        let c = self.verify(s)?;
        if c.cluster != cluster {
            return Err(VerifyError::WrongCluster {
                expected: cluster.into(),
                got: c.cluster,
            });
        }
        Ok(c)
    }

    /// Checks a signature field against exactly these bytes.
    ///
    /// # Errors
    /// [`VerifyError::SchemeNotAccepted`] for an Ed25519 signature given to an HMAC verifier or
    /// the reverse, [`VerifyError::UnknownKey`] for a key id not in the set,
    /// [`VerifyError::MalformedSignature`] / [`VerifyError::BadSignature`] otherwise.
    pub fn verify_bytes(&self, json: &[u8], sig: &str) -> Result<(), VerifyError> {
        let sig = sig.trim();
        let Some(rest) = sig.strip_prefix(ED25519_PREFIX) else {
            return match &self.hmac {
                Some(k) => crate::signing::verify(k, json, sig),
                None => Err(VerifyError::SchemeNotAccepted("hmac")),
            };
        };
        if self.hmac.is_some() {
            return Err(VerifyError::SchemeNotAccepted("ed25519"));
        }
        let (id, sig_hex) = rest
            .split_once(':')
            .ok_or(VerifyError::MalformedSignature)?;
        let bytes: [u8; 64] = hex::decode(sig_hex)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or(VerifyError::MalformedSignature)?;
        let key = self
            .keys
            .get(id)
            .copied()
            .or_else(|| self.file.as_ref().and_then(|f| f.get(id)))
            .ok_or_else(|| VerifyError::UnknownKey(id.chars().take(32).collect()))?;
        let mut msg = Vec::with_capacity(COMMAND_DOMAIN.len() + id.len() + 1 + json.len());
        msg.extend_from_slice(COMMAND_DOMAIN);
        msg.extend_from_slice(id.as_bytes());
        msg.push(b'\n');
        msg.extend_from_slice(json);
        key.verify(&msg, &ed25519_dalek::Signature::from_bytes(&bytes))
            .map_err(|_| VerifyError::BadSignature)
    }
}

/// How the control plane finds each engine's ack key.
#[derive(Clone)]
pub enum AckKeys {
    /// Per-engine keys derived from this master.
    Derived(Vec<u8>),
    /// Compatibility mode: every engine seals acks with the shared command key.
    Shared(Vec<u8>),
}

impl fmt::Debug for AckKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AckKeys::Derived(_) => "AckKeys::Derived(redacted)",
            AckKeys::Shared(_) => "AckKeys::Shared(redacted)",
        })
    }
}

impl AckKeys {
    /// The key `instance` seals its acks with.
    pub fn key_for(&self, instance: &str) -> Vec<u8> {
        match self {
            AckKeys::Shared(k) => k.clone(),
            AckKeys::Derived(m) => derive_ack_key(m, instance),
        }
    }
}

/// An engine's ack key: `HMAC-SHA256(master, "brownout-ack-key\n" + instance)`.
pub fn derive_ack_key(master: &[u8], instance: &str) -> Vec<u8> {
    let mut label = b"brownout-ack-key\n".to_vec();
    label.extend_from_slice(instance.as_bytes());
    hmac_derive(master, &label)
}

/// Everything the control plane signs and verifies with.
#[derive(Debug, Clone)]
pub struct PlaneKeys {
    pub signer: CommandSigner,
    /// Its own public key plus any other accepted ones (a new leader reads a command signed
    /// before a rotation).
    pub verifier: CommandVerifier,
    pub acks: AckKeys,
    /// Seals the control plane's own values in Redis (the operator override).
    pub seal_key: Vec<u8>,
}

impl PlaneKeys {
    /// Compatibility mode: one shared HMAC key for everything (the scheme of earlier releases).
    pub fn hmac(key: &[u8]) -> PlaneKeys {
        PlaneKeys {
            signer: CommandSigner::Hmac(key.to_vec()),
            verifier: CommandVerifier::hmac(key),
            acks: AckKeys::Shared(key.to_vec()),
            seal_key: key.to_vec(),
        }
    }
    /// Ed25519: `signing` signs; its public key and `also_accept` verify; acks use per-engine
    /// keys derived from `ack_master`.
    pub fn ed25519(
        signing: CommandSigningKey,
        also_accept: impl IntoIterator<Item = CommandPublicKey>,
        ack_master: &[u8],
    ) -> PlaneKeys {
        let mut verifier = CommandVerifier::ed25519(also_accept);
        verifier.add(signing.public());
        PlaneKeys {
            seal_key: signing.seal_key(),
            signer: CommandSigner::Ed25519(signing),
            verifier,
            acks: AckKeys::Derived(ack_master.to_vec()),
        }
    }
}

/// `From` a shared HMAC key (as bytes, an array, a `Vec` or a reference to one: the
/// compatibility mode's `hmac` constructor) and from a reference to the keys themselves.
macro_rules! from_hmac_key {
    ($t:ident) => {
        impl<const N: usize> From<&[u8; N]> for $t {
            fn from(k: &[u8; N]) -> $t {
                $t::hmac(k)
            }
        }
        impl From<&[u8]> for $t {
            fn from(k: &[u8]) -> $t {
                $t::hmac(k)
            }
        }
        impl From<Vec<u8>> for $t {
            fn from(k: Vec<u8>) -> $t {
                $t::hmac(&k)
            }
        }
        impl From<&Vec<u8>> for $t {
            fn from(k: &Vec<u8>) -> $t {
                $t::hmac(k)
            }
        }
        impl From<&$t> for $t {
            fn from(k: &$t) -> $t {
                k.clone()
            }
        }
    };
}

from_hmac_key!(PlaneKeys);

/// What an engine (serving tier, proxy) verifies commands and seals acks with.
#[derive(Debug, Clone)]
pub struct EngineKeys {
    pub verifier: CommandVerifier,
    /// This instance's own ack key (as read at start; see [`EngineKeys::current_ack_key`]).
    pub ack_key: Vec<u8>,
    /// `BROWNOUT_ACK_KEY_FILE`, read again when it changes (shared by the clones).
    pub ack_key_file: Option<Arc<AckKeyFile>>,
}

/// An engine's ack-key file and the key last read from it: read again when the file changed
/// (compared at most once a second, at the next ack) or after [`request_key_reload`]
/// (SIGHUP); a file that becomes unreadable or malformed leaves the key read before in use.
pub struct AckKeyFile {
    path: PathBuf,
    state: Mutex<(Instant, u64, Vec<u8>)>,
}

impl fmt::Debug for AckKeyFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AckKeyFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl AckKeyFile {
    /// Reads `path` (a 64-hex-digit secret).
    ///
    /// # Errors
    /// The file cannot be read or holds no such secret.
    pub fn open(path: &Path) -> Result<AckKeyFile, KeyError> {
        let key = read_secret_file(path)?;
        Ok(AckKeyFile {
            path: path.to_path_buf(),
            state: Mutex::new((
                Instant::now(),
                RELOAD_GENERATION.load(Ordering::Relaxed),
                key,
            )),
        })
    }

    /// The key, after reading the file again if it is due.
    pub fn key(&self) -> Vec<u8> {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let generation = RELOAD_GENERATION.load(Ordering::Relaxed);
        let now = Instant::now();
        if generation != st.1 || now.duration_since(st.0) >= KEY_FILE_CHECK {
            st.0 = now;
            st.1 = generation;
            match read_secret_file(&self.path) {
                Ok(k) if k != st.2 => {
                    tracing::info!(path = %self.path.display(), "ack key file changed: acks are sealed with the new key");
                    st.2 = k;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "ack key file unreadable; the key read before stays in use");
                }
            }
        }
        st.2.clone()
    }
}

impl EngineKeys {
    /// Compatibility mode: the shared HMAC key verifies commands and seals acks.
    pub fn hmac(key: &[u8]) -> EngineKeys {
        EngineKeys {
            verifier: CommandVerifier::hmac(key),
            ack_key: key.to_vec(),
            ack_key_file: None,
        }
    }

    /// From the environment, for instance `instance`:
    /// - `BROWNOUT_COMMAND_SIGNATURE=hmac`: the shared key `hmac_key` (the caller's
    ///   `BROWNOUT_COMMAND_KEY`) is required and used for both;
    /// - otherwise (Ed25519): public keys from `BROWNOUT_COMMAND_PUBKEY` and
    ///   `BROWNOUT_COMMAND_PUBKEY_FILE`, else the control plane's `command-signing.pub` in the
    ///   data directory ([`default_data_dir`]) when it exists; the ack key from
    ///   `BROWNOUT_ACK_KEY` / `BROWNOUT_ACK_KEY_FILE`, else derived from the data directory's
    ///   `ack-master.key` when it exists (the same-host default: see docs/SECURITY.md).
    ///
    /// `Ok(None)` in Ed25519 mode when no public key is found at all.
    ///
    /// # Errors
    /// [`KeyError`] for a bad scheme name, a malformed key, an unreadable file, or (Ed25519) a
    /// public key found but no ack key.
    pub fn from_env(
        instance: &str,
        hmac_key: Option<&str>,
    ) -> Result<Option<EngineKeys>, KeyError> {
        EngineKeys::from_env_in(instance, hmac_key, &default_data_dir())
    }

    /// [`EngineKeys::from_env`] with the data directory given instead of `BROWNOUT_DATA_DIR`.
    ///
    /// # Errors
    /// As [`EngineKeys::from_env`].
    pub fn from_env_in(
        instance: &str,
        hmac_key: Option<&str>,
        dir: &Path,
    ) -> Result<Option<EngineKeys>, KeyError> {
        let var = |n: &str| std::env::var(n).ok().filter(|v| !v.trim().is_empty());
        match var(SIGNATURE_ENV).as_deref().map(str::trim) {
            Some("hmac") => {
                return Ok(hmac_key
                    .filter(|k| !k.is_empty())
                    .map(|k| EngineKeys::hmac(k.as_bytes())));
            }
            None | Some("ed25519") => {}
            Some(other) => return Err(KeyError::Scheme(SIGNATURE_ENV, other.into())),
        }
        let mut keys = Vec::new();
        if let Some(v) = var(PUBKEY_ENV) {
            keys.extend(parse_public_keys(&v)?);
        }
        let key_file = var(PUBKEY_FILE_ENV).map(PathBuf::from);
        let overlap = match var(PUBKEY_OVERLAP_ENV) {
            None => DEFAULT_PUBKEY_OVERLAP,
            Some(v) => Duration::from_secs(v.trim().parse().map_err(|_| {
                KeyError::Io(
                    PUBKEY_OVERLAP_ENV.into(),
                    format!("not a number of seconds: {v:?}"),
                )
            })?),
        };
        let mut verifier = CommandVerifier::ed25519(Vec::new());
        if let Some(p) = &key_file {
            verifier = verifier.with_key_file(p, overlap)?;
        }
        if keys.is_empty() && key_file.is_none() {
            let p = dir.join(PUBLIC_KEY_FILE);
            if let Ok(t) = std::fs::read_to_string(&p) {
                keys.extend(parse_public_keys(&t)?);
            }
        }
        if keys.is_empty() && verifier.key_ids().is_empty() {
            return Ok(None);
        }
        for k in keys {
            verifier.add(k);
        }
        let mut ack_key_file = None;
        let ack_key = if let Some(k) = var(ACK_KEY_ENV) {
            parse_secret(&k)?
        } else if let Some(p) = var(ACK_KEY_FILE_ENV) {
            let f = AckKeyFile::open(Path::new(&p))?;
            let k = f.key();
            ack_key_file = Some(Arc::new(f));
            k
        } else {
            let p = dir.join(ACK_MASTER_FILE);
            if !p.exists() {
                return Err(KeyError::Io(
                    format!("{ACK_KEY_ENV} (or {ACK_KEY_ENV}_FILE, or {})", p.display()),
                    "no ack key for this instance: mint one with `brownout keys ack-key --instance ID` on the control plane".into(),
                ));
            }
            derive_ack_key(&read_secret_file(&p)?, instance)
        };
        Ok(Some(EngineKeys {
            verifier,
            ack_key,
            ack_key_file,
        }))
    }
}

impl EngineKeys {
    /// The key acks are sealed with now: the ack-key file's latest, or the one read at start.
    pub fn current_ack_key(&self) -> Vec<u8> {
        match &self.ack_key_file {
            Some(f) => f.key(),
            None => self.ack_key.clone(),
        }
    }
}

from_hmac_key!(EngineKeys);

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: &str = include_str!("../fixtures/command_t2.json");

    fn cmd() -> Command {
        serde_json::from_str(JSON).unwrap()
    }

    // Known answer, computed independently with OpenSSL from the seed (the 32 ASCII bytes
    // `brownout-test-ed25519-seed-00001`):
    //   printf 302e020100300506032b657004220420<seed hex> | xxd -r -p > k.der
    //   (printf 'brownout-command-ed25519\n9c50865cf054c1c8\n'; cat fixtures/command_t2.json) > m
    //   openssl pkeyutl -sign -inkey k.der -keyform DER -rawin -in m | xxd -p -c 128
    // and the key id as the first 16 hex digits of `sha256sum` over the raw public key.
    const SEED: &[u8; 32] = b"brownout-test-ed25519-seed-00001";
    const ED_SIG: &str = include_str!("../fixtures/command_t2.ed25519.sig");
    const ED_PUB: &str = include_str!("../fixtures/command_t2.ed25519.pub");

    /// An engine's ack-key file rewritten under it: acks are sealed with the new key after a
    /// reload request; a broken file leaves the key in use.
    #[test]
    fn a_changed_ack_key_file_seals_the_next_ack_with_the_new_key() {
        let dir = std::env::temp_dir().join(format!(
            "brownout-ackfile-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ack.key");
        let (a, b) = ([1u8; 32], [2u8; 32]);
        std::fs::write(&path, hex::encode(a)).unwrap();
        let keys = EngineKeys {
            verifier: CommandVerifier::ed25519([]),
            ack_key: a.to_vec(),
            ack_key_file: Some(Arc::new(AckKeyFile::open(&path).unwrap())),
        };
        assert_eq!(keys.current_ack_key(), a.to_vec());
        std::fs::write(&path, hex::encode(b)).unwrap();
        request_key_reload();
        let clone = keys.clone();
        assert_eq!(clone.current_ack_key(), b.to_vec(), "the new file's key");
        assert_eq!(keys.current_ack_key(), b.to_vec(), "clones share the file");
        std::fs::write(&path, "not a key").unwrap();
        request_key_reload();
        assert_eq!(
            keys.current_ack_key(),
            b.to_vec(),
            "a broken file changes nothing"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A key file rotated under a running verifier: the new key is accepted at once after a
    /// reload request, the dropped one for the overlap only, and a broken file changes nothing.
    #[test]
    fn a_changed_key_file_rotates_the_accepted_keys_with_an_overlap() {
        let dir = std::env::temp_dir().join(format!(
            "brownout-keyfile-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("command-signing.pub");
        let (a, b) = (CommandSigningKey::generate(), CommandSigningKey::generate());
        let sign =
            |k: &CommandSigningKey| CommandSigner::Ed25519(k.clone()).sign_bytes(JSON.as_bytes());
        std::fs::write(&path, format!("# the old key\n{}\n", a.public())).unwrap();
        let long = CommandVerifier::ed25519([])
            .with_key_file(&path, Duration::from_secs(3600))
            .unwrap();
        let none = CommandVerifier::ed25519([])
            .with_key_file(&path, Duration::ZERO)
            .unwrap();
        for v in [&long, &none] {
            v.verify_bytes(JSON.as_bytes(), &sign(&a)).unwrap();
            assert!(matches!(
                v.verify_bytes(JSON.as_bytes(), &sign(&b)),
                Err(VerifyError::UnknownKey(_))
            ));
        }
        // The file now lists only b (a ConfigMap update): b at once, a for the overlap only.
        std::fs::write(&path, format!("{}\n", b.public())).unwrap();
        request_key_reload();
        for v in [&long, &none] {
            v.verify_bytes(JSON.as_bytes(), &sign(&b)).unwrap();
        }
        long.verify_bytes(JSON.as_bytes(), &sign(&a)).unwrap();
        assert!(matches!(
            none.verify_bytes(JSON.as_bytes(), &sign(&a)),
            Err(VerifyError::UnknownKey(_))
        ));
        assert_eq!(none.key_ids(), vec![b.id().to_string()]);
        // A clone shares the file (the subscriber clones its config).
        let clone = none.clone();
        clone.verify_bytes(JSON.as_bytes(), &sign(&b)).unwrap();
        // A malformed file leaves the keys read before in use.
        std::fs::write(&path, "ed25519:not-a-key\n").unwrap();
        request_key_reload();
        none.verify_bytes(JSON.as_bytes(), &sign(&b)).unwrap();
        // Unchanged files are compared at most once a second, so without a request the change
        // shows after that second.
        std::fs::write(&path, format!("{}\n", a.public())).unwrap();
        std::thread::sleep(KEY_FILE_CHECK + Duration::from_millis(50));
        none.verify_bytes(JSON.as_bytes(), &sign(&a)).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn known_answer_ed25519_signature_matches_fixture() {
        let k = CommandSigningKey::from_seed(SEED);
        assert_eq!(k.public().to_string(), ED_PUB.trim());
        assert_eq!(k.id(), "9c50865cf054c1c8");
        assert_eq!(
            CommandSigner::Ed25519(k).sign_bytes(JSON.as_bytes()),
            ED_SIG.trim()
        );
        let v = CommandVerifier::ed25519([CommandPublicKey::parse(ED_PUB).unwrap()]);
        v.verify_bytes(JSON.as_bytes(), ED_SIG).unwrap();
    }

    #[test]
    fn ed25519_signatures_verify_only_under_a_listed_key() {
        let a = CommandSigningKey::from_seed(&[1; 32]);
        let b = CommandSigningKey::from_seed(&[2; 32]);
        let s = CommandSigner::Ed25519(a.clone()).sign(&cmd());
        assert!(
            s.sig.starts_with(&format!("ed25519:{}:", a.id())),
            "{}",
            s.sig
        );
        let only_a = CommandVerifier::ed25519([a.public()]);
        assert_eq!(only_a.verify(&s).unwrap(), cmd());
        // Signed by another key: its id is not listed.
        let sb = CommandSigner::Ed25519(b.clone()).sign(&cmd());
        assert!(matches!(
            only_a.verify(&sb),
            Err(VerifyError::UnknownKey(_))
        ));
        // Another key's signature relabelled with a listed id: refused.
        let relabelled = SignedCommand {
            json: sb.json.clone(),
            sig: sb.sig.replace(b.id(), a.id()),
        };
        assert!(matches!(
            only_a.verify(&relabelled),
            Err(VerifyError::BadSignature)
        ));
        // Both listed (rotation): both verify.
        let both = CommandVerifier::ed25519([a.public(), b.public()]);
        both.verify(&s).unwrap();
        both.verify(&sb).unwrap();
        // Any flipped byte of the JSON fails.
        for i in 0..s.json.len() {
            let mut t = s.json.as_bytes().to_vec();
            t[i] ^= 1;
            assert!(both.verify_bytes(&t, &s.sig).is_err(), "byte {i}");
        }
    }

    #[test]
    fn schemes_do_not_cross() {
        let a = CommandSigningKey::from_seed(&[1; 32]);
        let ed = CommandSigner::Ed25519(a.clone()).sign(&cmd());
        let hm = CommandSigner::Hmac(b"k".to_vec()).sign(&cmd());
        // An HMAC (old) subscriber refuses an Ed25519 signature.
        assert!(crate::signing::verify(b"k", ed.json.as_bytes(), &ed.sig).is_err());
        assert!(ed.verify(b"k").is_err());
        assert!(matches!(
            CommandVerifier::hmac(b"k").verify(&ed),
            Err(VerifyError::SchemeNotAccepted(_))
        ));
        // An Ed25519 verifier refuses any HMAC signature, whatever its key.
        assert!(matches!(
            CommandVerifier::ed25519([a.public()]).verify(&hm),
            Err(VerifyError::SchemeNotAccepted(_))
        ));
        CommandVerifier::hmac(b"k").verify(&hm).unwrap();
    }

    #[test]
    fn malformed_signatures_are_errors() {
        let v = CommandVerifier::ed25519([CommandSigningKey::from_seed(&[1; 32]).public()]);
        for sig in [
            "ed25519:",
            "ed25519:abc",
            "ed25519:abc:zz",
            "ed25519:abc:0011",
        ] {
            assert!(
                matches!(
                    v.verify_bytes(b"{}", sig),
                    Err(VerifyError::MalformedSignature)
                ),
                "{sig}"
            );
        }
    }

    #[test]
    fn public_keys_parse_and_print() {
        let k = CommandSigningKey::from_seed(&[7; 32]).public();
        let text = format!(
            "# rotation\n{k}  # new\n{}\n",
            CommandSigningKey::from_seed(&[8; 32]).public()
        );
        let ks = parse_public_keys(&text).unwrap();
        assert_eq!(ks.len(), 2);
        assert_eq!(ks[0], k);
        assert_eq!(CommandPublicKey::parse(&k.to_string()[8..]).unwrap(), k);
        assert!(CommandPublicKey::parse("ed25519:00").is_err());
        assert!(parse_public_keys("ed25519:zz").is_err());
    }

    #[test]
    fn ack_keys_are_per_instance() {
        let m = b"master-0123456789".to_vec();
        let ka = derive_ack_key(&m, "engine-a");
        assert_ne!(ka, derive_ack_key(&m, "engine-b"));
        let ack = crate::Ack::Applied {
            epoch: 1,
            version: 2,
            applied_at_ms: 3,
            entry: None,
        };
        let w = ack.to_signed(&ka, "engine-a");
        let plane = AckKeys::Derived(m);
        assert_eq!(
            crate::Ack::parse_signed(&w, &plane.key_for("engine-a"), "engine-a"),
            Ok(ack.clone())
        );
        // engine-a's key cannot ack for engine-b.
        let forged = ack.to_signed(&ka, "engine-b");
        assert!(crate::Ack::parse_signed(&forged, &plane.key_for("engine-b"), "engine-b").is_err());
    }

    #[test]
    fn data_dir_keys_are_generated_once_and_private() {
        let dir = std::env::temp_dir().join(format!("brownout-keys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = load_or_create_in(&dir).unwrap();
        assert!(a.created);
        let b = load_or_create_in(&dir).unwrap();
        assert!(!b.created);
        assert_eq!(a.signing.id(), b.signing.id());
        assert_eq!(a.ack_master, b.ack_master);
        let pubs = std::fs::read_to_string(dir.join(PUBLIC_KEY_FILE)).unwrap();
        assert_eq!(parse_public_keys(&pubs).unwrap(), vec![a.signing.public()]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(dir.join(SIGNING_KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "{mode:o}");
        }
        std::fs::write(dir.join(SIGNING_KEY_FILE), "nothex").unwrap();
        assert!(matches!(
            load_or_create_in(&dir),
            Err(KeyError::PrivateKey(_))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
