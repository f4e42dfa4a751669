//! Trust state that only moves forward: the network's signed policy and
//! its revocations as a [`Member`] takes them, and what of them a host
//! keeps on disk ([`Kept`]) so that neither a relist nor a restart goes
//! back on them. A writer to the store without the network key, or one
//! with it that deletes or rolls back (the admin's credentials in the
//! wrong hands), cannot make a host take an older policy or forget a
//! revocation: the member refuses a serial not above the one held
//! (counted), and a deleted key withdraws nothing.
//!
//! Sans-IO: the daemon reads the kept state and gives it to
//! [`Member::restore`] before the first listing, and writes
//! [`Member::kept`] whenever [`Member::kept_version`] moves.

use super::{Change, Member, NetPolicy, RecordError};
use crate::layout::{host_key, valid_cert_id, valid_name};
use crate::trust::{NetworkPublic, TrustError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::Arc;

/// What a host keeps of a signed network's trust state across restarts:
/// the newest signed policy it took (the policy key's value, checked
/// again when read) and every host and certificate id revoked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kept {
    pub network: String,
    /// The signed policy's serial (also inside `policy`; for people).
    #[serde(default)]
    pub serial: u64,
    /// The signed policy, `BASE64(policy).BASE64(signature)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    #[serde(default)]
    pub revoked_hosts: BTreeSet<String>,
    #[serde(default)]
    pub revoked_certs: BTreeSet<String>,
}

/// Why kept state was refused (the daemon names its file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeptError {
    #[error("it is network `{found}`'s, not `{want}`'s")]
    Network { found: String, want: String },
    #[error("this network has no network key: nothing is kept")]
    Unsigned,
    #[error("policy: {0} (was the network key replaced? then delete this file)")]
    Policy(TrustError),
    #[error("policy: serial {kept} is not the signed policy's ({signed})")]
    Serial { kept: u64, signed: u64 },
    #[error("`{0}` is not a host name or a certificate id")]
    Name(String),
    #[error("more than {0} revocations of hosts or of certificates")]
    TooMany(usize),
}

impl Kept {
    /// Checks kept state for `network` under its key: the policy signed
    /// by it, for it, of the serial said; names that are names; at most
    /// `max_revoked` of each kind.
    pub fn check(&self, network: &str, nk: &NetworkPublic, max_revoked: usize) -> Result<(), KeptError> {
        self.checked(network, nk, max_revoked).map(drop)
    }

    /// [`Kept::check`], with the policy verified.
    fn checked(
        &self,
        network: &str,
        nk: &NetworkPublic,
        max_revoked: usize,
    ) -> Result<Option<NetPolicy>, KeptError> {
        if self.network != network {
            return Err(KeptError::Network { found: self.network.clone(), want: network.to_string() });
        }
        if self.revoked_hosts.len() > max_revoked || self.revoked_certs.len() > max_revoked {
            return Err(KeptError::TooMany(max_revoked));
        }
        if let Some(bad) = self.revoked_hosts.iter().find(|h| !valid_name(h)) {
            return Err(KeptError::Name(bad.clone()));
        }
        if let Some(bad) = self.revoked_certs.iter().find(|c| !valid_cert_id(c)) {
            return Err(KeptError::Name(bad.clone()));
        }
        let Some(text) = &self.policy else { return Ok(None) };
        let (body, declared) = nk.verify_policy(text).map_err(KeptError::Policy)?;
        if body.network != network {
            return Err(KeptError::Policy(TrustError::Policy(format!(
                "signed for network `{}`",
                body.network
            ))));
        }
        if body.serial != self.serial {
            return Err(KeptError::Serial { kept: self.serial, signed: body.serial });
        }
        let p = NetPolicy {
            serial: body.serial,
            lines: body.lines,
            signed: text.clone(),
            declared: Arc::new(declared),
        };
        Ok(Some(p))
    }
}

impl Member {
    /// Takes what this host kept of the network's trust state (read from
    /// its disk at the start, before any listing): the policy held and the
    /// revocations seen, as if the store had just said them. Refused whole
    /// if it does not check ([`Kept::check`]).
    pub fn restore(&mut self, kept: &Kept) -> Result<(), KeptError> {
        let nk = self.policy.network_key.ok_or(KeptError::Unsigned)?;
        let policy = kept.checked(&self.network, &nk, self.policy.max_revoked)?;
        if let Some(p) = policy {
            if self.net_policy.as_ref().is_none_or(|held| held.serial < p.serial) {
                self.net_policy = Some(p);
                self.policy_version += 1;
            }
        }
        let max = self.policy.max_revoked;
        for h in &kept.revoked_hosts {
            if self.revoked_hosts.len() < max {
                self.revoked_hosts.insert(h.as_str().into());
            }
        }
        for c in &kept.revoked_certs {
            if self.revoked_certs.len() < max {
                self.revoked_certs.insert(c.as_str().into());
            }
        }
        Ok(())
    }

    /// What this host keeps on disk of the network's trust state now.
    pub fn kept(&self) -> Kept {
        Kept {
            network: self.network.clone(),
            serial: self.net_policy.as_ref().map_or(0, |p| p.serial),
            policy: self.net_policy.as_ref().map(|p| p.signed.clone()),
            revoked_hosts: self.revoked_hosts.iter().map(|h| h.to_string()).collect(),
            revoked_certs: self.revoked_certs.iter().map(|c| c.to_string()).collect(),
        }
    }

    /// Counts the changes of [`Member::kept`] (a new policy taken, a
    /// revocation seen): the daemon writes it again only then.
    pub fn kept_version(&self) -> u64 {
        self.kept_version
    }

    /// Takes the network's policy, signed by the network key, for this
    /// network, with a serial higher than the one held (the same one again,
    /// as a relist brings it, is no change; a lower one is refused and
    /// counted).
    pub(super) fn put_policy(&mut self, value: &[u8]) -> Result<(), RecordError> {
        let Some(nk) = self.policy.network_key else {
            return Err(RecordError::Policy(TrustError::Policy(
                "this network has no network key to check a policy with".into(),
            )));
        };
        let text = std::str::from_utf8(value).map_err(|_| RecordError::Policy(TrustError::CertForm))?;
        let text = text.trim();
        let (body, declared) = nk.verify_policy(text).map_err(RecordError::Policy)?;
        if body.network != self.network {
            return Err(RecordError::Policy(TrustError::Policy(format!(
                "signed for network `{}`, not `{}`",
                body.network, self.network
            ))));
        }
        match &self.net_policy {
            Some(held) if held.serial == body.serial && held.lines == body.lines => return Ok(()),
            Some(held) if held.serial >= body.serial => {
                self.stats.stale_policies += 1;
                return Err(RecordError::StalePolicy { serial: body.serial, held: held.serial });
            }
            _ => {}
        }
        self.net_policy = Some(NetPolicy {
            serial: body.serial,
            lines: body.lines,
            signed: text.to_string(),
            declared: Arc::new(declared),
        });
        self.policy_version += 1;
        self.kept_version += 1;
        Ok(())
    }

    /// The network's signed policy as taken: its serial and what it
    /// declares; and a count of its changes (a caller builds again only
    /// then).
    pub fn signed_policy(&self) -> Option<(u64, &Arc<vnet_control::policy::Policies>)> {
        self.net_policy.as_ref().map(|p| (p.serial, &p.declared))
    }

    pub fn policy_version(&self) -> u64 {
        self.policy_version
    }

    /// Takes a revocation signed by the network key: the host it names
    /// (with any certificate, or with the one it names) is dropped now,
    /// and such records are refused from then on.
    pub(super) fn put_revocation(
        &mut self,
        key: &str,
        value: &[u8],
        out: &mut Vec<Change>,
    ) -> Result<(), RecordError> {
        let Some(nk) = &self.policy.network_key else {
            return Err(RecordError::Revocation(TrustError::CertBody(
                "this network has no network key to check revocations with".into(),
            )));
        };
        let text = std::str::from_utf8(value).map_err(|_| RecordError::Revocation(TrustError::CertForm))?;
        let r = nk.verify_revocation(text.trim()).map_err(RecordError::Revocation)?;
        if r.network != self.network || r.key() != key {
            return Err(RecordError::RevocationKey);
        }
        let max = self.policy.max_revoked;
        let full = match &r.cert {
            None => self.revoked_hosts.len() >= max && !self.revoked_hosts.contains(r.host.as_str()),
            Some(id) => self.revoked_certs.len() >= max && !self.revoked_certs.contains(id.as_str()),
        };
        if full {
            return Err(RecordError::Revocation(TrustError::CertBody(format!("more than {max} held"))));
        }
        let new = match &r.cert {
            None => self.revoked_hosts.insert(r.host.as_str().into()),
            Some(id) => self.revoked_certs.insert(id.as_str().into()),
        };
        if new {
            self.kept_version += 1;
        }
        let Some(&h) = self.ids.get(r.host.as_str()) else { return Ok(()) };
        let parked = self.duplicates.iter().find(|(d, ..)| *d == h).map(|(.., id)| id.clone());
        let id = self.cert_ids.get(&h).cloned().or(parked.clone().flatten());
        let hit = r.cert.is_none() || id == r.cert;
        if hit && (self.records[h as usize].is_some() || parked.is_some()) {
            self.drop_host(h, out);
            let why = RecordError::Revoked(format!("by {key}"));
            self.stats.bad_records += 1;
            self.hold(host_key(&self.network, &r.host), why);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{policy_key, revoked_host_key};
    use crate::member::Policy;
    use crate::store::{Event, MemStore};
    use crate::trust::{NetworkKey, PolicyBody, Revocation};

    fn view(nk: &NetworkKey) -> Member {
        let policy = Policy { network_key: Some(nk.public()), have_key: true, ..Policy::default() };
        Member::with_policy("n", "h1", policy)
    }

    fn policy(nk: &NetworkKey, serial: u64) -> Vec<u8> {
        let b = PolicyBody { network: "n".into(), serial, lines: format!("rule r{serial} allow\n") };
        nk.sign_policy(&b).unwrap().into_bytes()
    }

    fn listed(m: &mut Member, s: &MemStore) {
        let (kvs, rev) = s.range(m.prefix());
        m.relist(&kvs, rev, &mut Vec::new());
    }

    /// A restart: what the last run kept is taken before the first
    /// listing, so a store rolled back (an older policy put, a
    /// revocation deleted, by whoever holds the admin's credentials) takes
    /// nothing back; the rollback is refused and counted.
    #[test]
    fn a_restart_keeps_the_newest_policy_and_every_revocation() {
        let nk = NetworkKey::generate().unwrap();
        let mut s = MemStore::new();
        let mut m = view(&nk);
        assert_eq!(m.kept_version(), 0);
        s.put(&policy_key("n"), policy(&nk, 6), None);
        let r = Revocation { network: "n".into(), host: "h3".into(), cert: None, at: 1 };
        s.put(&revoked_host_key("n", "h3"), nk.revoke(&r).unwrap().into_bytes(), None);
        listed(&mut m, &s);
        assert_eq!(m.kept_version(), 2, "a policy and a revocation taken");
        // The same again (a relist): nothing new to keep.
        listed(&mut m, &s);
        assert_eq!(m.kept_version(), 2);
        let kept = m.kept();
        assert_eq!((kept.serial, kept.revoked_hosts.len()), (6, 1));
        // Through its file form, as the daemon writes and reads it.
        let kept: Kept = serde_json::from_slice(&serde_json::to_vec(&kept).unwrap()).unwrap();
        // The rollback: an older policy, the revocation deleted.
        s.put(&policy_key("n"), policy(&nk, 4), None);
        s.delete_if(&revoked_host_key("n", "h3"), None);
        // Positive control: a host that kept nothing takes the rollback.
        let mut forgetful = view(&nk);
        listed(&mut forgetful, &s);
        assert_eq!(forgetful.signed_policy().map(|(s, _)| s), Some(4));
        assert_eq!(forgetful.revoked(), (0, 0));
        // The restarted host: 6 and the revocation, the 4 refused, counted.
        let mut m = view(&nk);
        m.restore(&kept).unwrap();
        assert_eq!((m.signed_policy().map(|(s, _)| s), m.policy_version()), (Some(6), 1));
        listed(&mut m, &s);
        assert_eq!(m.signed_policy().map(|(s, _)| s), Some(6));
        assert_eq!((m.stats.stale_policies, m.stats.bad_records), (1, 1));
        assert_eq!(m.revoked(), (1, 0));
        // The revoked host's record is refused.
        let mut out = Vec::new();
        let value = br#"{"addr":"10.0.0.3:9000"}"#.to_vec();
        m.apply(
            &Event::Put { key: crate::layout::host_key("n", "h3"), value, rev: 99, created: 99 },
            &mut out,
        );
        assert!(!m.live("h3"));
        // A deleted key withdraws nothing; a newer policy is kept anew.
        s.put(&policy_key("n"), policy(&nk, 7), None);
        listed(&mut m, &s);
        assert_eq!((m.kept().serial, m.kept_version()), (7, 1));
    }

    /// Kept state that does not check is refused whole, with why: another
    /// network's, a policy another key signed (or tampered with), a serial
    /// that is not the policy's, a name that is not one, too many.
    #[test]
    fn kept_state_that_does_not_check_is_refused() {
        let nk = NetworkKey::generate().unwrap();
        let good = Kept {
            network: "n".into(),
            serial: 6,
            policy: Some(String::from_utf8(policy(&nk, 6)).unwrap()),
            revoked_hosts: ["h3".to_string()].into(),
            revoked_certs: BTreeSet::new(),
        };
        assert_eq!(view(&nk).restore(&good), Ok(()));
        let other = NetworkKey::generate().unwrap();
        let cases = [
            (Kept { network: "m".into(), ..good.clone() }, "network `m`'s"),
            (Kept { policy: Some(String::from_utf8(policy(&other, 6)).unwrap()), ..good.clone() }, "policy:"),
            (Kept { serial: 9, ..good.clone() }, "serial 9"),
            (Kept { revoked_hosts: ["a/b".to_string()].into(), ..good.clone() }, "`a/b`"),
            (Kept { revoked_certs: ["xyz".to_string()].into(), ..good.clone() }, "`xyz`"),
        ];
        for (bad, said) in cases {
            let e = view(&nk).restore(&bad).unwrap_err().to_string();
            assert!(e.contains(said), "{e}");
        }
        let mut small = view(&nk);
        small.policy.max_revoked = 0;
        assert_eq!(small.restore(&good), Err(KeptError::TooMany(0)));
        assert_eq!(Member::new("n", "h1").restore(&good), Err(KeptError::Unsigned));
        assert!(serde_json::from_slice::<Kept>(br#"{"network":"n","extra":1}"#).is_err());
    }
}
