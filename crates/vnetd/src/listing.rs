//! Reading a prefix of the store in pages, at one revision.
//!
//! etcd-client refuses a response larger than 4 MiB (tonic's default
//! limit, which the crate does not let a client raise), and etcd takes
//! values up to its request limit (1.25 MiB in the etcd `vnetctl network
//! init` generates): a host may write values that large under its own
//! keys, so a single listing of a network, or of its address pools,
//! could be made to fail for every host, and with it every host's start,
//! reconnection and address allocation. So every listing is read in
//! pages of at most [`PAGE`] keys, each asked at the revision of the
//! first, and a page whose answer is too large is asked again with half
//! as many keys, down to one (which fits: one value is at most etcd's
//! request limit).

use etcd_client::{Client, GetOptions, KeyValue};

/// The most keys one page asks for.
pub const PAGE: i64 = 512;

/// The end of the range of keys that start with `prefix` (etcd's
/// `prefix + 1`): its last byte below 0xff raised by one, the bytes after
/// it dropped; the whole key space's end (`\0`) when every byte is 0xff.
fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Every key under `prefix` (with its value, revisions and lease) and the
/// store's revision they were read at.
pub async fn list(c: &mut Client, prefix: &str) -> Result<(Vec<KeyValue>, i64), etcd_client::Error> {
    let end = range_end(prefix.as_bytes());
    let mut from = prefix.as_bytes().to_vec();
    let (mut all, mut rev, mut page) = (Vec::new(), 0i64, PAGE);
    loop {
        let mut opts = GetOptions::new().with_range(end.clone()).with_limit(page);
        if rev > 0 {
            opts = opts.with_revision(rev);
        }
        let mut resp = match c.get(from.clone(), Some(opts)).await {
            Ok(r) => r,
            Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::OutOfRange && page > 1 => {
                page = (page / 2).max(1);
                continue;
            }
            Err(e) => return Err(e),
        };
        if rev == 0 {
            rev = resp.header().map_or(0, |h| h.revision());
        }
        let more = resp.more();
        let kvs = resp.take_kvs();
        let Some(last) = kvs.last().map(|kv| kv.key().to_vec()) else { break };
        all.extend(kvs);
        if !more {
            break;
        }
        // The next page starts just after this one's last key.
        from = last;
        from.push(0);
    }
    Ok((all, rev))
}

#[cfg(test)]
mod tests {
    use super::range_end;

    #[test]
    fn a_prefixs_range_ends_past_every_key_that_starts_with_it() {
        assert_eq!(range_end(b"/vnet/n/"), b"/vnet/n0".to_vec());
        assert_eq!(range_end(b"a\xff"), b"b".to_vec());
        assert_eq!(range_end(b"\xff\xff"), vec![0]);
    }
}
