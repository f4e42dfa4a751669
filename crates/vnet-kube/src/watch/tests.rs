use super::*;
use serde_json::json;

fn policy(ns: &str, name: &str, rv: &str) -> serde_json::Value {
    json!({"metadata": {"namespace": ns, "name": name, "resourceVersion": rv}, "spec": {"podSelector": {}}})
}

fn line(kind: &str, obj: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap()
}

#[test]
fn a_list_by_pages_then_events_keep_the_store() {
    let kind = network_policies();
    let mut s = Store::default();
    let mut into = BTreeMap::new();
    let page1 = json!({"metadata": {"resourceVersion": "10", "continue": "abc"},
                       "items": [policy("a", "p", "5"), {"metadata": {"name": "no-namespace"}}]});
    let next = s.page(&serde_json::to_vec(&page1).unwrap(), kind.parse, &mut into).unwrap();
    assert_eq!(next.as_deref(), Some("abc"));
    assert_eq!(
        (into.len(), s.bad, s.objects.len()),
        (1, 1, 0),
        "the list is built apart, the bad one counted"
    );
    let page2 = json!({"metadata": {"resourceVersion": "11"}, "items": [policy("b", "q", "6")]});
    assert_eq!(s.page(&serde_json::to_vec(&page2).unwrap(), kind.parse, &mut into).unwrap(), None);
    s.objects = into;
    assert_eq!(s.version, "11");
    assert!(s.event(&line("ADDED", policy("c", "r", "12")), kind.parse).unwrap());
    assert_eq!(s.version, "12");
    assert!(s.event(&line("DELETED", policy("a", "p", "13")), kind.parse).unwrap());
    assert!(!s.event(&line("DELETED", policy("a", "p", "14")), kind.parse).unwrap(), "already gone");
    assert!(!s.event(&line("BOOKMARK", json!({"metadata": {"resourceVersion": "20"}})), kind.parse).unwrap());
    assert_eq!(s.version, "20");
    assert_eq!(s.objects.keys().collect::<Vec<_>>(), ["b/q", "c/r"]);
    // A policy that cannot be read: counted, and what was held stays.
    let bad = json!({"metadata": {"namespace": "b", "name": "q"}, "spec": {"ingress": "all"}});
    assert!(!s.event(&line("MODIFIED", bad), kind.parse).unwrap());
    assert_eq!((s.bad, s.objects.len()), (2, 2));
    let gone = json!({"kind": "Status", "code": 410, "message": "too old resource version"});
    assert_eq!(s.event(&line("ERROR", gone), kind.parse), Err(WatchError::Gone));
    let denied = json!({"kind": "Status", "code": 403, "message": "forbidden"});
    assert_eq!(s.event(&line("ERROR", denied), kind.parse), Err(WatchError::Status(403, "forbidden".into())));
    assert!(s.event(b"{\"type\":\"SURPRISE\"}", kind.parse).is_err());
    assert!(s.event(b"not json", kind.parse).is_err());
}

#[test]
fn events_are_split_into_lines_and_bounded() {
    let mut buf = Vec::new();
    let mut seen = Vec::new();
    let mut take = |l: &[u8]| {
        seen.push(String::from_utf8(l.to_vec()).unwrap());
        Ok(())
    };
    lines(&mut buf, b"{\"a\":1}\n{\"b\"", 100, &mut take).unwrap();
    lines(&mut buf, b":2}\n\n", 100, &mut take).unwrap();
    assert_eq!(seen, ["{\"a\":1}", "{\"b\":2}"]);
    assert!(buf.is_empty());
    let mut buf = Vec::new();
    let e = lines(&mut buf, &[b'x'; 101], 100, |_| Ok(())).unwrap_err();
    assert_eq!(e, WatchError::TooLong(100), "a line never ended is not held past the bound");
}

#[test]
fn a_full_store_refuses_and_counts() {
    let kind = namespaces();
    let mut s = Store::default();
    for i in 0..MAX_OBJECTS {
        s.objects.insert(
            format!("n{i}"),
            crate::objects::Namespace { name: String::new(), labels: Default::default() },
        );
    }
    let ns = json!({"metadata": {"name": "one-more"}});
    assert!(!s.event(&line("ADDED", ns), kind.parse).unwrap());
    assert_eq!((s.refused, s.objects.len()), (1, MAX_OBJECTS));
    assert!(s
        .event(&line("MODIFIED", json!({"metadata": {"name": "n7", "labels": {"a": "b"}}})), kind.parse)
        .unwrap());
}

#[test]
fn a_continue_token_is_escaped() {
    let e: String = url_escape("a+b/c=&d e").collect();
    assert_eq!(e, "a%2Bb%2Fc%3D%26d%20e");
}
