//! Saving and restoring the miner: [`MinerState`] (templates, aliases and word slots, so ids
//! survive restarts), [`MinerStateStore`] where it is kept, [`JsonFileStateStore`] for a file.

use serde::{Deserialize, Serialize};

use super::{MinerConfig, Slot, Template, TemplateId, TemplateMiner};

/// The version of [`MinerState`] this build writes and reads.
pub const STATE_VERSION: u32 = 2;

/// Why a saved miner state was refused.
#[derive(Debug, thiserror::Error)]
pub enum MinerError {
    #[error("miner state version {0} is not supported (expected {STATE_VERSION})")]
    Version(u32),
    #[error("miner state holds template {0} twice")]
    DuplicateId(TemplateId),
    #[error("miner state: {0}")]
    Json(#[from] serde_json::Error),
}

/// The miner's state as saved to the store (JSON). Ids survive a save/load round trip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MinerState {
    pub version: u32,
    pub config: MinerConfig,
    pub tick: u64,
    pub num_evictions: u64,
    pub templates: Vec<TemplateState>,
    /// Templates merged into another one: `[from, into]`.
    #[serde(default)]
    pub aliases: Vec<[TemplateId; 2]>,
    /// Word slots still counting their words.
    #[serde(default)]
    pub slots: Vec<SlotState>,
}

/// One saved template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateState {
    pub id: TemplateId,
    pub template: String,
    pub count: u64,
    pub last_seen: u64,
}

/// One saved word slot: the templates that differ only in it and the words seen there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotState {
    pub key: u64,
    pub members: Vec<TemplateId>,
    pub words: Vec<u64>,
}

/// Where miner state is kept between restarts (the store implements it; a JSON file does too).
pub trait MinerStateStore {
    type Error: std::error::Error + Send + Sync + 'static;
    /// The saved state, or `None` when nothing was saved yet.
    fn load(&self) -> Result<Option<MinerState>, Self::Error>;
    fn save(&self, state: &MinerState) -> Result<(), Self::Error>;
}

/// [`MinerStateStore`] over one JSON file (the CLI's `--state FILE`).
#[derive(Debug, Clone)]
pub struct JsonFileStateStore(pub std::path::PathBuf);

/// Why the JSON state file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JsonFileStateError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
}

impl MinerStateStore for JsonFileStateStore {
    type Error = JsonFileStateError;
    fn load(&self) -> Result<Option<MinerState>, Self::Error> {
        let path = self.0.display().to_string();
        match std::fs::read(&self.0) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| JsonFileStateError::Json { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(JsonFileStateError::Io { path, source }),
        }
    }
    fn save(&self, state: &MinerState) -> Result<(), Self::Error> {
        let path = self.0.display().to_string();
        let bytes = serde_json::to_vec(state).map_err(|source| JsonFileStateError::Json {
            path: path.clone(),
            source,
        })?;
        let tmp = self.0.with_extension("tmp");
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &self.0))
            .map_err(|source| JsonFileStateError::Io { path, source })
    }
}

impl TemplateMiner {
    /// The state to persist; [`TemplateMiner::from_state`] restores it with the same ids.
    pub fn state(&self) -> MinerState {
        let mut ts: Vec<(&u64, &Template)> = self.templates.iter().collect();
        ts.sort_by_key(|(_, t)| t.seq);
        let templates = ts
            .into_iter()
            .map(|(id, t)| TemplateState {
                id: TemplateId(*id),
                template: t.tokens.join(" "),
                count: t.count,
                last_seen: t.last_seen,
            })
            .collect();
        let mut aliases: Vec<[TemplateId; 2]> = self
            .aliases
            .iter()
            .map(|(from, to)| [TemplateId(*from), *to])
            .collect();
        aliases.sort();
        let mut slots: Vec<SlotState> = self
            .slots
            .iter()
            .map(|(key, s)| SlotState {
                key: *key,
                members: s.members.clone(),
                words: s.words.clone(),
            })
            .collect();
        slots.sort_by_key(|s| s.key);
        MinerState {
            version: STATE_VERSION,
            config: self.config.clone(),
            tick: self.tick,
            num_evictions: self.num_evictions,
            templates,
            aliases,
            slots,
        }
    }

    /// Restores a miner from saved state (templates in the order they were created).
    ///
    /// # Errors
    /// An unknown state version or a duplicated template id.
    pub fn from_state(state: MinerState) -> Result<Self, MinerError> {
        if state.version != STATE_VERSION {
            return Err(MinerError::Version(state.version));
        }
        let mut m = TemplateMiner::new(state.config);
        m.tick = state.tick;
        m.num_evictions = state.num_evictions;
        for t in state.templates {
            if m.templates.contains_key(&t.id.0) {
                return Err(MinerError::DuplicateId(t.id));
            }
            let tokens: Vec<Box<str>> = if t.template.is_empty() {
                Vec::new()
            } else {
                t.template.split(' ').map(Box::from).collect()
            };
            m.seq += 1;
            m.index(t.id, &tokens);
            m.templates
                .insert(t.id.0, Template::new(tokens, t.count, t.last_seen, m.seq));
        }
        for [from, to] in state.aliases {
            m.aliases.insert(from.0, to);
        }
        for s in state.slots {
            m.slots.insert(
                s.key,
                Slot {
                    members: s.members,
                    words: s.words,
                },
            );
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_across_processes_and_restarts() {
        let lines = [
            "a b 1",
            "user alice logged in from 10.0.0.1",
            "user bob logged in from 10.0.0.2",
            "disk full on /dev/sda1",
            "calling the weather service",
            "calling the hotel service",
        ];
        let mut m1 = TemplateMiner::default();
        let ids1: Vec<_> = lines.iter().map(|l| m1.add(l)).collect();
        let mut m2 = TemplateMiner::default();
        let ids2: Vec<_> = lines.iter().map(|l| m2.add(l)).collect();
        assert_eq!(ids1, ids2);
        assert_ne!(ids1[4], ids1[5]);
        let json = serde_json::to_string(&m1.state()).unwrap();
        let mut restored = TemplateMiner::from_state(serde_json::from_str(&json).unwrap()).unwrap();
        assert_eq!(restored.templates(), m1.templates());
        assert_eq!(restored.add("user carol logged in from 10.0.0.3"), ids1[1]);
        assert_eq!(restored.add("disk full on /dev/sdb2"), ids1[3]);
        assert_eq!(restored.add("calling the hotel service"), ids1[5]);
        // The word slot was saved too: a third word merges the slot, into the oldest id.
        let third = restored.add("calling the maps service");
        assert_eq!(third, ids1[4]);
        assert_eq!(restored.resolve(ids1[5]), ids1[4]);
        assert_eq!(m1.add("calling the maps service"), ids1[4]);
        let json2 = serde_json::to_string(&restored.state()).unwrap();
        let again = TemplateMiner::from_state(serde_json::from_str(&json2).unwrap()).unwrap();
        assert_eq!(again.resolve(ids1[5]), ids1[4]);
        assert_eq!(again.template(ids1[5]).unwrap(), "calling the <*> service");
    }

    #[test]
    fn bad_state_is_refused() {
        let mut s = TemplateMiner::default().state();
        s.version = 1;
        assert!(matches!(
            TemplateMiner::from_state(s),
            Err(MinerError::Version(1))
        ));
        let mut m = TemplateMiner::default();
        m.add("x y");
        let mut s = m.state();
        s.templates.push(s.templates[0].clone());
        assert!(matches!(
            TemplateMiner::from_state(s),
            Err(MinerError::DuplicateId(_))
        ));
    }
}
