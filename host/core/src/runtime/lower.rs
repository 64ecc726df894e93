//! The `view` argument of `decide`, lowered straight from an [`sdk::View`].
//!
//! The bindings that `bindgen!` generates lower `list<pending>` one field at a
//! time: every `u64` store looks the guest's memory up again through the
//! instance and the canonical options and bounds-checks it, and the record's field
//! offsets are recomputed per element. At a queue depth of 32 that was half of a
//! `decide` call (BENCHMARKS.md §1, "2026-11-26"). [`ViewArg`] is the same
//! `view` record (the derive type-checks it against the component's own type
//! when an instance is made, so a component built against another contract is
//! refused as before) whose queue is stored with one memory lookup and one bounds
//! check for the whole list, and which borrows the host's view instead of
//! copying it into a `wit::View` first.
//!
//! What reaches the guest is byte for byte what the generated bindings write: the
//! canonical ABI fixes `pending`'s layout (three little-endian `u64` at offsets
//! 0, 8 and 16; size 24, alignment 8) and the list's allocation is still made by
//! wasmtime's own list lowering through the guest's `cabi_realloc`.
//!
//! The one module of the crate that allows `unsafe` (the lowering traits are
//! unsafe to implement); each use says why it is sound.

#![allow(unsafe_code)]

use std::mem::MaybeUninit;

use wasmtime::component::__internal::{CanonicalAbiInfo, InstanceType, InterfaceType, LowerContext};
use wasmtime::component::{ComponentType, Lower, TypedFunc};

use super::wit;
use sluice_sdk as sdk;

/// One queued request as the `decide` argument carries it: the host's own
/// [`sdk::Pending`], lowered as the contract's `pending` record.
#[repr(transparent)]
pub(crate) struct QueueEntry(sdk::Pending);

/// Bytes of one `pending` in the guest's memory (canonical ABI: three `u64`).
const PENDING_SIZE: usize = 24;

// The bulk store below writes the layout by hand: stop the build if the record's
// canonical layout (computed by wasmtime from the generated type) is not it.
const _: () = {
    assert!(<wit::Pending as ComponentType>::ABI.size32 as usize == PENDING_SIZE);
    assert!(<wit::Pending as ComponentType>::ABI.align32 == 8);
};

impl QueueEntry {
    /// The host's queue as the argument's list, without copying it.
    fn slice(queue: &[sdk::Pending]) -> &[QueueEntry] {
        // SAFETY: `QueueEntry` is `repr(transparent)` over `sdk::Pending`, so the
        // two slices have the same layout and the lifetime is carried over.
        unsafe { std::slice::from_raw_parts(queue.as_ptr().cast::<QueueEntry>(), queue.len()) }
    }

    fn to_wit(&self) -> wit::Pending {
        wit::Pending { id: self.0.id, arrival: self.0.arrival, deadline: self.0.deadline }
    }
}

// SAFETY: every item is the generated `wit::Pending`'s (its lowered form, its ABI
// and its type check against the component's `pending` record), so wasmtime
// treats a `QueueEntry` exactly as it treats a `wit::Pending`.
unsafe impl ComponentType for QueueEntry {
    type Lower = <wit::Pending as ComponentType>::Lower;

    const ABI: CanonicalAbiInfo = <wit::Pending as ComponentType>::ABI;

    const MAY_REQUIRE_REALLOC: bool = false;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <wit::Pending as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: a single entry is lowered by the generated code; a list of them is
// stored with the canonical layout checked above, within the bounds wasmtime's
// list lowering allocated and checked (`offset`, `items.len() * SIZE32`).
unsafe impl Lower for QueueEntry {
    fn linear_lower_to_flat<T>(
        &self,
        cx: &mut LowerContext<'_, T>,
        ty: InterfaceType,
        dst: &mut MaybeUninit<Self::Lower>,
    ) -> wasmtime::Result<()> {
        self.to_wit().linear_lower_to_flat(cx, ty, dst)
    }

    fn linear_lower_to_memory<T>(
        &self,
        cx: &mut LowerContext<'_, T>,
        ty: InterfaceType,
        offset: usize,
    ) -> wasmtime::Result<()> {
        self.to_wit().linear_lower_to_memory(cx, ty, offset)
    }

    fn linear_store_list_to_memory<T>(
        cx: &mut LowerContext<'_, T>,
        _ty: InterfaceType,
        offset: usize,
        items: &[Self],
    ) -> wasmtime::Result<()> {
        // One lookup of the guest's memory and one bounds check for the whole
        // list (the generated code does both for each of the 3 fields of each entry).
        let memory = cx.as_slice_mut();
        let Some(dst) = offset.checked_add(items.len() * PENDING_SIZE).and_then(|end| memory.get_mut(offset..end))
        else {
            wasmtime::bail!("queue list out of bounds of the guest's memory");
        };
        for (out, item) in dst.chunks_exact_mut(PENDING_SIZE).zip(items) {
            let p = &item.0;
            out[0..8].copy_from_slice(&p.id.to_le_bytes());
            out[8..16].copy_from_slice(&p.arrival.to_le_bytes());
            out[16..24].copy_from_slice(&p.deadline.to_le_bytes());
        }
        Ok(())
    }
}

/// The contract's `view` record, borrowed from an [`sdk::View`].
#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct ViewArg<'a> {
    now: u64,
    worker: u32,
    workers: u32,
    #[component(name = "load-qps")]
    load_qps: f64,
    loaded: &'a [u32],
    queue: &'a [QueueEntry],
}

impl<'a> ViewArg<'a> {
    /// `view` as the argument of `decide` (no copy).
    pub(crate) fn new(view: &'a sdk::View) -> ViewArg<'a> {
        ViewArg {
            now: view.now,
            worker: view.worker,
            workers: view.workers,
            load_qps: view.load_qps,
            loaded: &view.loaded,
            queue: QueueEntry::slice(&view.queue),
        }
    }
}

/// `decide: func(view: view) -> decision`, called with a [`ViewArg`]. The
/// lifetime is `'static` only in the stored, type-checked handle; each call makes
/// a handle for its own borrow ([`decide_func`]).
pub(crate) type DecideFunc = TypedFunc<(ViewArg<'static>,), (wit::Decision,)>;

/// The handle of `f` for a call whose view lives for `'a`.
pub(crate) fn decide_func<'a>(f: &DecideFunc) -> TypedFunc<(ViewArg<'a>,), (wit::Decision,)> {
    // SAFETY: `f` was type-checked against the component's `decide` when the
    // instance was made, with the same types; lifetimes play no part in a type check.
    unsafe { TypedFunc::new_unchecked(*f.func()) }
}
