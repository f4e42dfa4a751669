//! Watching a kind of object as client-go's reflector does: list it (by
//! pages), then watch from the list's `resourceVersion`, applying each
//! event to a [`Store`]; when the watch ends (its `timeoutSeconds`, or the
//! connection) watch again from the last version seen; when the API says
//! the version is gone (410) or anything fails, list again, after a pause
//! that grows to [`BACKOFF_MAX`]. Meanwhile the store keeps what it held:
//! an API that cannot be reached leaves the last view in force.
//!
//! Bounded: a page's answer at most [`PAGE_LIMIT`] bytes, an event at most
//! [`crate::LIMIT`], at most [`MAX_OBJECTS`] objects a store (more are
//! counted in `refused` and not held). Only the parts an object's parser
//! keeps are held. An object that cannot be read is counted (`bad`); the
//! store keeps what it held under its name.

use crate::objects::{self, ObjectError};
use crate::Api;
use http_body_util::BodyExt;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Objects asked a page.
pub const PAGE: usize = 250;
/// The most of a page's answer read.
pub const PAGE_LIMIT: usize = 16 << 20;
/// Objects a store holds at most.
pub const MAX_OBJECTS: usize = 200_000;
/// How long the API keeps one watch open.
pub const WATCH_SECONDS: u32 = 300;
/// The longest pause between failed attempts.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Why a list or a watch ended.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum WatchError {
    #[error("{0}")]
    Api(String),
    #[error("the API answered {0}: {1}")]
    Status(u16, String),
    #[error("the version watched from is gone (410): listing again")]
    Gone,
    #[error("an answer that is not the JSON expected: {0}")]
    Json(String),
    #[error("an event longer than {0} bytes")]
    TooLong(usize),
}

/// A kind of object: where it is listed and how it is read.
pub struct Kind<T> {
    /// The path of the list, every namespace's (`/api/v1/pods`).
    pub path: &'static str,
    pub parse: Parse<T>,
}

/// Pods, namespaces and NetworkPolicies, as NetworkPolicy needs them.
pub fn pods() -> Kind<objects::Pod> {
    Kind { path: "/api/v1/pods", parse: objects::pod }
}
pub fn namespaces() -> Kind<objects::Namespace> {
    Kind { path: "/api/v1/namespaces", parse: objects::namespace }
}
pub fn network_policies() -> Kind<objects::NetworkPolicy> {
    Kind { path: "/apis/networking.k8s.io/v1/networkpolicies", parse: objects::network_policy }
}
/// Services and EndpointSlices, as NetworkPolicy judges Service traffic
/// by them.
pub fn services() -> Kind<objects::Service> {
    Kind { path: "/api/v1/services", parse: objects::service }
}
pub fn endpoint_slices() -> Kind<objects::EndpointSlice> {
    Kind { path: "/apis/discovery.k8s.io/v1/endpointslices", parse: objects::endpoint_slice }
}
/// Nodes, for their addresses: where a pod reaches a NodePort.
pub fn nodes() -> Kind<objects::Node> {
    Kind { path: "/api/v1/nodes", parse: objects::node }
}

/// The objects of one kind, by `NAMESPACE/NAME` (a namespace's: `NAME`).
#[derive(Debug, Clone)]
pub struct Store<T> {
    pub objects: BTreeMap<String, T>,
    /// The version the next watch starts from.
    pub version: String,
    /// Listed whole at least once.
    pub synced: bool,
    /// Objects that could not be read, and objects past [`MAX_OBJECTS`].
    pub bad: u64,
    pub refused: u64,
    /// Changes applied (lists and events).
    pub changes: u64,
    /// The last failure, until a list succeeds.
    pub last_error: Option<String>,
}

impl<T> Default for Store<T> {
    fn default() -> Self {
        Store {
            objects: BTreeMap::new(),
            version: String::new(),
            synced: false,
            bad: 0,
            refused: 0,
            changes: 0,
            last_error: None,
        }
    }
}

fn key(m: &objects::Meta) -> String {
    if m.namespace.is_empty() {
        m.name.clone()
    } else {
        format!("{}/{}", m.namespace, m.name)
    }
}

/// The parser of a kind's objects.
type Parse<T> = fn(&serde_json::Value) -> Result<T, ObjectError>;

impl<T> Store<T> {
    /// Puts `obj` into `map` under its name; false when it could not be
    /// read or held (counted).
    fn put(
        &mut self,
        map: Option<&mut BTreeMap<String, T>>,
        obj: &serde_json::Value,
        parse: Parse<T>,
    ) -> bool {
        let (Ok(m), Ok(t)) = (objects::meta(obj), parse(obj)) else {
            self.bad += 1;
            return false;
        };
        let map = match map {
            Some(m) => m,
            None => &mut self.objects,
        };
        let k = key(&m);
        if !map.contains_key(&k) && map.len() >= MAX_OBJECTS {
            self.refused += 1;
            return false;
        }
        map.insert(k, t);
        true
    }

    /// One page of a list: its objects put into `into` (the list being
    /// built), and the `continue` token of the next page, if any.
    pub fn page(
        &mut self,
        body: &[u8],
        parse: Parse<T>,
        into: &mut BTreeMap<String, T>,
    ) -> Result<Option<String>, WatchError> {
        let v: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| WatchError::Json(e.to_string()))?;
        let items = v["items"].as_array().ok_or_else(|| WatchError::Json("a list without items".into()))?;
        for item in items {
            self.put(Some(&mut *into), item, parse);
        }
        self.version = v["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_string();
        Ok(v["metadata"]["continue"].as_str().filter(|c| !c.is_empty()).map(str::to_string))
    }

    /// One event line of a watch: whether it changed the objects.
    pub fn event(&mut self, line: &[u8], parse: Parse<T>) -> Result<bool, WatchError> {
        let v: serde_json::Value =
            serde_json::from_slice(line).map_err(|e| WatchError::Json(e.to_string()))?;
        let obj = &v["object"];
        if let Some(rv) = obj["metadata"]["resourceVersion"].as_str() {
            self.version = rv.to_string();
        }
        let changed = match v["type"].as_str() {
            Some("ADDED" | "MODIFIED") => self.put(None, obj, parse),
            Some("DELETED") => match objects::meta(obj) {
                Ok(m) => self.objects.remove(&key(&m)).is_some(),
                Err(_) => {
                    self.bad += 1;
                    false
                }
            },
            Some("BOOKMARK") => false,
            Some("ERROR") => {
                return Err(match obj["code"].as_u64() {
                    Some(410) => WatchError::Gone,
                    code => WatchError::Status(
                        code.and_then(|c| u16::try_from(c).ok()).unwrap_or(0),
                        obj["message"].as_str().unwrap_or_default().to_string(),
                    ),
                })
            }
            _ => return Err(WatchError::Json("an event of no known type".into())),
        };
        if changed {
            self.changes += 1;
        }
        Ok(changed)
    }
}

/// Splits `buf` (what arrived, `more` appended) into whole lines, each
/// given to `each`; keeps the rest. A line past `max` bytes is an error.
pub fn lines(
    buf: &mut Vec<u8>,
    more: &[u8],
    max: usize,
    mut each: impl FnMut(&[u8]) -> Result<(), WatchError>,
) -> Result<(), WatchError> {
    buf.extend_from_slice(more);
    let mut start = 0;
    while let Some(n) = buf[start..].iter().position(|&b| b == b'\n') {
        let line = &buf[start..start + n];
        if line.len() > max {
            return Err(WatchError::TooLong(max));
        }
        if !line.iter().all(u8::is_ascii_whitespace) {
            each(line)?;
        }
        start += n + 1;
    }
    buf.drain(..start);
    if buf.len() > max {
        return Err(WatchError::TooLong(max));
    }
    Ok(())
}

/// Lists `kind` whole into `store` (replacing what it held once every page
/// came).
pub async fn list<T>(api: &Api, kind: &Kind<T>, store: &Mutex<Store<T>>) -> Result<(), WatchError> {
    let mut into = BTreeMap::new();
    let mut next: Option<String> = None;
    loop {
        let mut path = format!("{}?limit={PAGE}", kind.path);
        if let Some(c) = &next {
            // A token the API made: sent back escaped, never as a path.
            path.push_str("&continue=");
            path.extend(url_escape(c));
        }
        let (status, body) =
            tokio::time::timeout(crate::TIMEOUT * 4, crate::get_limited(api, &path, PAGE_LIMIT))
                .await
                .unwrap_or_else(|_| Err("no answer in time".into()))
                .map_err(WatchError::Api)?;
        if status != 200 {
            return Err(WatchError::Status(status, crate::message(&body)));
        }
        let mut s = lock(store);
        next = s.page(&body, kind.parse, &mut into)?;
        if next.is_none() {
            s.objects = into;
            s.synced = true;
            s.changes += 1;
            s.last_error = None;
            return Ok(());
        }
    }
}

fn url_escape(s: &str) -> impl Iterator<Item = char> + '_ {
    s.bytes().flat_map(|b| {
        let plain = b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~');
        let v: Vec<char> = if plain { vec![b as char] } else { format!("%{b:02X}").chars().collect() };
        v.into_iter()
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One watch of `kind` from the store's version, until it ends; `changed`
/// is told of every change.
pub async fn follow<T>(
    api: &Api,
    kind: &Kind<T>,
    store: &Mutex<Store<T>>,
    changed: &tokio::sync::Notify,
) -> Result<(), WatchError> {
    let version: String = url_escape(&lock(store).version).collect();
    let path = format!(
        "{}?watch=1&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECONDS}&resourceVersion={version}",
        kind.path
    );
    let connect = tokio::time::timeout(crate::TIMEOUT, crate::send(api, &path));
    let (_, resp) =
        connect.await.unwrap_or_else(|_| Err("no answer in time".into())).map_err(WatchError::Api)?;
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    if status != 200 {
        let b = http_body_util::Limited::new(body, crate::LIMIT).collect().await;
        let msg = b.map(|b| crate::message(&b.to_bytes())).unwrap_or_default();
        return Err(if status == 410 { WatchError::Gone } else { WatchError::Status(status, msg) });
    }
    let mut buf = Vec::new();
    // The API closes the watch after WATCH_SECONDS; a silent connection
    // (bookmarks come every minute or so) is given up a little later.
    let idle = Duration::from_secs(u64::from(WATCH_SECONDS) + 30);
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err(WatchError::Api("the watch went silent".into())),
            Ok(None) => return Ok(()),
            Ok(Some(Err(e))) => return Err(WatchError::Api(e.to_string())),
            Ok(Some(Ok(f))) => f,
        };
        let Ok(data) = frame.into_data() else { continue };
        let mut s = lock(store);
        let mut any = false;
        lines(&mut buf, &data, crate::LIMIT, |line| {
            any |= s.event(line, kind.parse)?;
            Ok(())
        })?;
        drop(s);
        if any {
            changed.notify_one();
        }
    }
}

/// Keeps `store` following `kind`, for ever: list, watch, watch again,
/// list again after a failure. `api` gives the API anew each time (the
/// kubelet rotates the token).
pub async fn reflect<T>(
    api: impl Fn() -> Result<Api, String>,
    kind: Kind<T>,
    store: Arc<Mutex<Store<T>>>,
    changed: Arc<tokio::sync::Notify>,
) {
    let mut pause = Duration::from_millis(250);
    loop {
        let listed = match api() {
            Ok(a) => list(&a, &kind, &store).await.map(|()| a),
            Err(e) => Err(WatchError::Api(e)),
        };
        let failed = match listed {
            Ok(_) => {
                changed.notify_one();
                pause = Duration::from_millis(250);
                loop {
                    let followed = match api() {
                        Ok(a) => follow(&a, &kind, &store, &changed).await,
                        Err(e) => Err(WatchError::Api(e)),
                    };
                    if let Err(e) = followed {
                        break e;
                    }
                }
            }
            Err(e) => e,
        };
        if failed != WatchError::Gone {
            tracing::warn!(kind = kind.path, "kubernetes watch: {failed}; the last view stays in force");
            lock(&store).last_error = Some(failed.to_string());
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(BACKOFF_MAX);
        }
    }
}

#[cfg(test)]
mod tests;
