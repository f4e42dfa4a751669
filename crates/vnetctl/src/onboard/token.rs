//! Join tokens: one per host name, each its own etcd user, expiring.
//!
//! `vnetctl network token DIR HOST` makes, in etcd, a user and a role of
//! the same name ([`token_user`]) whose one permission is the write of one
//! key, `/vnet-join/NET/HOST`: a token holder can file (or overwrite) that
//! host's request and do nothing else (no read, no other key, no delete of
//! another request). Its expiry is kept beside it, readable by root only
//! (`/vnet-tokens/NET/HOST`); `approve` refuses the request of an expired
//! token, and `approve`, a new token for the host and expiry (swept by
//! every `network token`, `approve` and `revoke`) delete the user: a token
//! is used once. The token is text (`vnet2.` and base64 JSON) that names
//! the network, etcd's address and CA, the network's public key, the host
//! and its user's password: a secret, read by `join` from a file or
//! standard input, never from its command line (where `ps` shows it).

use base64::Engine;
use serde::{Deserialize, Serialize};
use std::time::Duration;

pub const TOKEN_PREFIX: &str = "vnet2.";
/// What `network setup` printed before tokens were per host.
const OLD_PREFIX: &str = "vnet1.";
/// A token's life unless `ttl` says otherwise: an hour.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);
/// The longest `ttl`: a week.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 86_400);
/// A token's longest text (what `join` reads at most).
pub const MAX_TOKEN_LEN: u64 = 16 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error(
        "a token of an older vnetctl (`network setup` printed it; it never expires): \
         make one for this host with `vnetctl network token DIR HOST`"
    )]
    Old,
    #[error(
        "not a join token (one starts `{TOKEN_PREFIX}`): copy the whole token `vnetctl network token` \
         printed, one line from `{TOKEN_PREFIX}` to its end, or its file as it is"
    )]
    NotAToken,
    /// Cut short or changed on its way (a copy of part of the line).
    #[error(
        "the token is cut short or damaged ({0}): copy the whole line `vnetctl network token` printed, \
         from `{TOKEN_PREFIX}` to its end, or its file as it is (scp keeps it whole)"
    )]
    Damaged(String),
    #[error("the token: {0}")]
    Parse(String),
    #[error("the token expired {0} s ago: ask the admin for a new one (`vnetctl network token DIR HOST`)")]
    Expired(u64),
    #[error("ttl `{0}`: a time from 1s to 7d, as 90s, 30m, 1h, 2d or seconds")]
    Ttl(String),
    #[error("no random bytes for the token's id")]
    Random,
}

/// What a join token carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Token {
    pub network: String,
    /// etcd's client URL (`https://IP:PORT`).
    pub etcd: String,
    /// The CA of etcd's certificate (PEM).
    pub ca: String,
    /// The network's public key.
    pub net_pub: String,
    /// The host it was made for: the one name it can file a request of.
    pub host: String,
    pub user: String,
    pub password: String,
    /// When it expires (seconds since the Unix epoch).
    pub expires: u64,
    /// This token's id ([`new_id`]): a request names it and signs it, so
    /// `approve` takes only a request made for the host's outstanding
    /// token, never an earlier one filed again under a new token.
    pub id: String,
}

/// A new token's id: 16 random bytes, in hex.
pub fn new_id() -> Result<String, TokenError> {
    let mut b = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
        .map_err(|_| TokenError::Random)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

impl Token {
    pub fn encode(&self) -> String {
        format!("{TOKEN_PREFIX}{}", b64().encode(serde_json::to_vec(self).unwrap_or_default()))
    }

    /// Reads a token's text (surrounding white space ignored).
    pub fn decode(text: &str) -> Result<Token, TokenError> {
        let text = text.trim();
        if text.starts_with(OLD_PREFIX) {
            return Err(TokenError::Old);
        }
        let raw = text.strip_prefix(TOKEN_PREFIX).ok_or(TokenError::NotAToken)?;
        let json = b64().decode(raw).map_err(|e| TokenError::Damaged(format!("not base64: {e}")))?;
        let t: Token = serde_json::from_slice(&json).map_err(|e| match e.classify() {
            serde_json::error::Category::Eof | serde_json::error::Category::Syntax => {
                TokenError::Damaged(e.to_string())
            }
            _ => TokenError::Parse(e.to_string()),
        })?;
        let named = |n: &str| vnet_cluster::layout::valid_name(n) && !reserved(n);
        if !vnet_cluster::layout::valid_name(&t.network) || !named(&t.host) {
            return Err(TokenError::Parse("its network or host is not a name".into()));
        }
        Ok(t)
    }

    /// `Err` once `now` (seconds since the epoch) is past its expiry.
    pub fn check_time(&self, now: u64) -> Result<(), TokenError> {
        match now.checked_sub(self.expires) {
            Some(ago) if ago > 0 => Err(TokenError::Expired(ago)),
            _ => Ok(()),
        }
    }
}

/// Whether words look like a token given on a command line (refused there).
pub fn looks_like_token(word: &str) -> bool {
    word.starts_with(TOKEN_PREFIX) || word.starts_with(OLD_PREFIX)
}

/// `90s`, `30m`, `1h`, `2d` or plain seconds, from 1 s to [`MAX_TTL`].
pub fn parse_ttl(s: &str) -> Result<Duration, TokenError> {
    let bad = || TokenError::Ttl(s.to_string());
    let (num, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s[..i], c),
        _ => (s, 's'),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(bad()),
    };
    let d = Duration::from_secs(n.checked_mul(mult).ok_or_else(bad)?);
    if d.is_zero() || d > MAX_TTL {
        return Err(bad());
    }
    Ok(d)
}

/// Host names vnet's own etcd users would collide with: `root`, `join`
/// (the join user of `network setup` before tokens were per host) and
/// `join-*` (a host `join-h1`'s user would be host h1's token user).
pub fn reserved(host: &str) -> bool {
    host == "root" || host == "join" || host.starts_with("join-")
}

/// The etcd user (and role) of host `host`'s token: `vnet/NETWORK/join/HOST`
/// (no host's user, `vnet/NETWORK/HOST`, has three `/`).
pub fn token_user(network: &str, host: &str) -> String {
    format!("vnet/{network}/join/{host}")
}

/// What [`token_user`] was before: `vnet-NETWORK-join-HOST`, which could be
/// another network's host's legacy user (network `a-join`, host `h1`).
pub fn legacy_token_user(network: &str, host: &str) -> String {
    format!("vnet-{network}-join-{host}")
}

/// Where root keeps a token's expiry in etcd (no role may read it).
pub fn record_key(network: &str, host: &str) -> String {
    format!("/vnet-tokens/{network}/{host}")
}

/// A token's record, beside it in etcd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub user: String,
    pub expires: u64,
    /// The token's id (none in a record of an older vnetctl: no request
    /// names it, so `approve` refuses them all; a new token mends it).
    #[serde(default)]
    pub id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        Token {
            network: "lab".into(),
            etcd: "https://10.0.0.1:2379".into(),
            ca: "CA".into(),
            net_pub: "K".into(),
            host: "h1".into(),
            user: token_user("lab", "h1"),
            password: "pw".into(),
            expires: 1000,
            id: new_id().unwrap(),
        }
    }

    #[test]
    fn a_token_round_trips_and_expires() {
        let t = token();
        assert_eq!(Token::decode(&format!("  {}\n", t.encode())).unwrap(), t);
        assert_eq!(t.check_time(999), Ok(()));
        assert_eq!(t.check_time(1000), Ok(()));
        assert_eq!(t.check_time(1030), Err(TokenError::Expired(30)));
        assert!(looks_like_token(&t.encode()));
    }

    #[test]
    fn strangers_old_tokens_and_reserved_hosts_are_refused() {
        assert_eq!(Token::decode("vnet1.e30"), Err(TokenError::Old));
        assert_eq!(Token::decode("hello"), Err(TokenError::NotAToken));
        assert!(matches!(Token::decode("vnet2.!!"), Err(TokenError::Damaged(_))));
        for host in ["join", "root", "join-h1", "a/b"] {
            let t = Token { host: host.into(), ..token() };
            assert!(matches!(Token::decode(&t.encode()), Err(TokenError::Parse(_))), "{host}");
        }
        // A field of the JSON added by a forger is no field of a token.
        let mut v = serde_json::to_value(token()).unwrap();
        v["admin"] = true.into();
        let forged = format!("{TOKEN_PREFIX}{}", b64().encode(v.to_string()));
        assert!(matches!(Token::decode(&forged), Err(TokenError::Parse(_))));
        assert!(!reserved("h1") && !reserved("joiner") && reserved("join"));
        // A token's user is no host's, in any network sharing the etcd.
        use vnet_cluster::layout::host_user;
        assert_ne!(token_user("a", "h1"), host_user("a-join", "h1"));
        assert_eq!(legacy_token_user("a", "h1"), vnet_cluster::layout::legacy_host_user("a-join", "h1"));
        // A token without an id (an older vnetctl's) is not one of this version.
        let mut v = serde_json::to_value(token()).unwrap();
        v.as_object_mut().unwrap().remove("id");
        let old = format!("{TOKEN_PREFIX}{}", b64().encode(v.to_string()));
        assert!(matches!(Token::decode(&old), Err(TokenError::Parse(_))));
        assert_ne!(new_id().unwrap(), new_id().unwrap());
    }

    /// A token cut short anywhere (a copy of part of the line) says to
    /// copy the whole line; the positive control: the whole line decodes.
    #[test]
    fn a_truncated_token_says_to_copy_the_whole_line() {
        let whole = token();
        let text = whole.encode();
        assert_eq!(Token::decode(&text), Ok(whole));
        for cut in [3, 6, 7, 10, 20, text.len() / 2, text.len() - 5, text.len() - 1] {
            let said = Token::decode(&text[..cut]).unwrap_err().to_string();
            assert!(said.contains("copy the whole"), "cut at {cut}: {said}");
        }
        // The head lost: not a token, and the same advice.
        let said = Token::decode(&text[8..]).unwrap_err().to_string();
        assert!(said.contains("copy the whole"), "{said}");
    }

    #[test]
    fn ttls_parse_within_bounds() {
        assert_eq!(parse_ttl("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_ttl("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_ttl("1h"), Ok(DEFAULT_TTL));
        assert_eq!(parse_ttl("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_ttl("5"), Ok(Duration::from_secs(5)));
        for bad in ["", "0", "0s", "8d", "1w", "h", "-1", "99999999999999999999d", "1.5h"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }
}
