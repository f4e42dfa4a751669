//! The loaded object's programs and maps, by name, and a hash map kept
//! equal to the decisions held for it.

use super::{map_error, program_error, KernelError, Reason};
use aya::maps::{HashMap as BpfHashMap, MapData};
use aya::Ebpf;
use std::collections::BTreeMap;

/// Makes hash map `name` hold `next` where it holds `held` (what was
/// written before): writes what differs, removes what is gone. `held` is
/// kept true to the map even when a write fails halfway.
pub(super) fn write_diff<K: aya::Pod + Ord, V: aya::Pod + PartialEq>(
    ebpf: &mut Ebpf,
    name: &str,
    held: &mut BTreeMap<K, V>,
    next: BTreeMap<K, V>,
) -> Result<(), Reason> {
    let mut m: BpfHashMap<&mut MapData, K, V> = map(ebpf, name)?;
    for (k, v) in &next {
        if held.get(k) != Some(v) {
            held.remove(k);
            m.insert(k, v, 0).map_err(map_error(name))?;
            held.insert(*k, *v);
        }
    }
    held.retain(|k, _| next.contains_key(k) || m.remove(k).is_err());
    Ok(())
}

/// The keys hash map `name` holds, each with a default value (one that
/// no decision has: what a comparison with the held decisions rewrites).
pub(super) fn keys<K: aya::Pod, V: aya::Pod + Default, C: FromIterator<(K, V)>>(
    ebpf: &mut Ebpf,
    name: &str,
) -> Result<C, Reason> {
    let m: BpfHashMap<&mut MapData, K, V> = map(ebpf, name)?;
    Ok(m.keys().filter_map(Result::ok).map(|k| (k, V::default())).collect())
}

/// Program `name` of the object, as its type `T`.
pub(super) fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, Reason>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let p = ebpf.program_mut(name).ok_or_else(|| KernelError::NoProgram(name.into()))?;
    p.try_into().map_err(program_error(name))
}

/// Map `name` of the object, as its type `T`.
pub(super) fn map<'a, T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> Result<T, Reason> {
    let m = ebpf.map_mut(name).ok_or_else(|| KernelError::NoMap(name.into()))?;
    T::try_from(m).map_err(map_error(format!("map {name}")))
}
