//! Guest memory lent as bytes, for a frame cut through from a guest's TX
//! buffers to where it goes.

/// The bytes of guest memory `s`, for a frame cut through from a guest's
/// TX buffers to where it goes (another guest's RX buffers, a TAP, a
/// socket): copied once, there, instead of first into a bounce buffer.
pub fn guest_bytes<'a, B: vm_memory::bitmap::BitmapSlice>(s: &vm_memory::VolatileSlice<'a, B>) -> &'a [u8] {
    let g = s.ptr_guard();
    // SAFETY:
    // - The pointer and length are those of `s`, a checked slice of a
    //   mapping of the guest's memory (`GuestMemoryMmap`, not Xen's
    //   per-access mappings): it stays mapped for `'a`, the life of the
    //   memory guard the slice was taken from (vm-memory unmaps a region
    //   only when its last guard is dropped).
    // - The guest may write these bytes while they are read (as a NIC's DMA
    //   may read a buffer the driver still touches): they are only copied,
    //   never interpreted. Routing reads the headers copied out before, so
    //   a racing guest can corrupt only its own frame's payload.
    unsafe { std::slice::from_raw_parts(g.as_ptr(), g.len()) }
}
