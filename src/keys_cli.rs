//! `brownout keys`: the command-signing key pair and the engines' ack keys
//! (docs/SECURITY.md "Command signatures").
//!
//! - `brownout keys init [--dir D]`: generate (or load) `command-signing.key`,
//!   `command-signing.pub` and `ack-master.key` in the data directory; prints the public key.
//! - `brownout keys public [--dir D]`: prints the public key (what engines list in
//!   `BROWNOUT_COMMAND_PUBKEY`).
//! - `brownout keys ack-key --instance ID [--dir D]`: prints that instance's ack key (its
//!   `BROWNOUT_ACK_KEY`), derived from the ack master; it seals that instance's acks only.

use std::path::PathBuf;

use brownout_protocol::command_keys as ck;

#[derive(Debug, clap::Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    cmd: KeysCmd,
}

#[derive(Debug, clap::Subcommand)]
enum KeysCmd {
    /// Generate the key pair and the ack master in the data directory (kept if present).
    Init(DirArg),
    /// Print the command public key.
    Public(DirArg),
    /// Print one instance's ack key (`BROWNOUT_ACK_KEY`).
    AckKey {
        /// The instance id (`--instance-id` of `brownout-serve`).
        #[arg(long)]
        instance: String,
        #[command(flatten)]
        dir: DirArg,
    },
}

#[derive(Debug, clap::Args)]
struct DirArg {
    /// The control plane's data directory (default `BROWNOUT_DATA_DIR`, else `./data`).
    #[arg(long)]
    dir: Option<PathBuf>,
}

impl DirArg {
    fn path(&self) -> PathBuf {
        self.dir.clone().unwrap_or_else(ck::default_data_dir)
    }
}

/// Runs `brownout keys`.
///
/// # Errors
/// A key file that cannot be read, written or parsed.
pub fn run(a: &KeysArgs) -> anyhow::Result<()> {
    match &a.cmd {
        KeysCmd::Init(d) | KeysCmd::Public(d) => {
            let dir = d.path();
            let k = if matches!(a.cmd, KeysCmd::Init(_)) {
                ck::load_or_create_in(&dir)?.signing
            } else {
                ck::CommandSigningKey::load(&dir.join(ck::SIGNING_KEY_FILE))?
            };
            println!("{}", k.public());
        }
        KeysCmd::AckKey { instance, dir } => {
            let m = ck::read_secret_file(&dir.path().join(ck::ACK_MASTER_FILE))?;
            println!("{}", hex::encode(ck::derive_ack_key(&m, instance)));
        }
    }
    Ok(())
}
