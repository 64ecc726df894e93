//! The `view` argument of `decide`, lowered straight from an [`sdk::View`].
//!
//! The bindings that `bindgen!` generates lower `list<pending>` one field at a
//! time: every `u64` store looks the guest's memory up again through the
//! instance and the canonical options and bounds-checks it, and the record's
//! field offsets are recomputed per element. At a queue depth of 32 that was half
//! of a `decide` call (BENCHMARKS.md §1, "The view lowered straight from the
//! host's"). [`ViewArg`] is the same `view` record (the derive type-checks it
//! against the component's own type when an instance is made, so a component
//! built against another contract is refused as before) whose queue is stored
//! with one memory lookup and one bounds check for the whole list, and which
//! borrows the host's view instead of copying it into a `wit::View` first.
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::{Binding, Limits, PolicyEngine, PolicyInstance};
    use sluice_sdk::{Config, Decision, Pending, View};

    /// A policy component written by hand, whose `decide` answers `wait-until(h)`
    /// with `h` a hash of every byte of the view as the guest received it (`now`,
    /// `worker`, `workers`, `load-qps`'s bits, each `loaded` id, and each
    /// queue entry's `id`, `arrival`, `deadline` read at their canonical offsets):
    /// a lowering that put a field in the wrong place or dropped one answers
    /// another instant. Its `realloc` is a bump allocator (reset after each
    /// `decide`) that grows the memory on demand.
    const ECHO: &str = r#"(component
      (core module $m
        (memory (export "memory") 1)
        (global $heap (mut i32) (i32.const 1024))
        (func (export "realloc") (param i32 i32 i32 i32) (result i32)
          (local $p i32) (local $end i32)
          (local.set $p (i32.and (i32.add (global.get $heap) (i32.sub (local.get 2) (i32.const 1)))
                                 (i32.sub (i32.const 0) (local.get 2))))
          (local.set $end (i32.add (local.get $p) (local.get 3)))
          (if (i32.gt_u (local.get $end) (i32.mul (memory.size) (i32.const 65536)))
            (then (drop (memory.grow (i32.add (i32.const 1)
              (i32.div_u (i32.sub (local.get $end) (i32.mul (memory.size) (i32.const 65536))) (i32.const 65536)))))))
          (global.set $heap (local.get $end))
          (local.get $p))
        (func $mix (param $h i64) (param $x i64) (result i64)
          (i64.add (i64.mul (local.get $h) (i64.const 1000003)) (local.get $x)))
        (func (export "init") (param i32 i32 i64 i32 i32 i32 i32 i32 i32) (result i32)
          (global.set $heap (i32.const 1024))
          (i32.store8 (i32.const 64) (i32.const 0))
          (i32.const 64))
        (func (export "decide") (param $now i64) (param $worker i32) (param $workers i32) (param $load f64)
                                (param $lp i32) (param $ln i32) (param $qp i32) (param $qn i32) (result i32)
          (local $h i64) (local $i i32)
          (local.set $h (local.get $now))
          (local.set $h (call $mix (local.get $h) (i64.extend_i32_u (local.get $worker))))
          (local.set $h (call $mix (local.get $h) (i64.extend_i32_u (local.get $workers))))
          (local.set $h (call $mix (local.get $h) (i64.reinterpret_f64 (local.get $load))))
          (local.set $h (call $mix (local.get $h) (i64.extend_i32_u (local.get $ln))))
          (block $done (loop $next
            (br_if $done (i32.ge_u (local.get $i) (local.get $ln)))
            (local.set $h (call $mix (local.get $h)
              (i64.load32_u (i32.add (local.get $lp) (i32.shl (local.get $i) (i32.const 2))))))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $next)))
          (local.set $h (call $mix (local.get $h) (i64.extend_i32_u (local.get $qn))))
          (local.set $i (i32.const 0))
          (block $done (loop $next
            (br_if $done (i32.ge_u (local.get $i) (i32.mul (local.get $qn) (i32.const 3))))
            (local.set $h (call $mix (local.get $h)
              (i64.load (i32.add (local.get $qp) (i32.shl (local.get $i) (i32.const 3))))))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $next)))
          (global.set $heap (i32.const 1024))
          (i32.store8 (i32.const 128) (i32.const 1))
          (i64.store (i32.const 136) (local.get $h))
          (i32.const 128))
        (func (export "observe") (param i32 i32 i64 i64 i32)))
      (core instance $i (instantiate $m))
      (alias core export $i "memory" (core memory $mem))
      (alias core export $i "realloc" (core func $realloc))
      (type $model' (record (field "id" u32) (field "name" string) (field "accuracy" f64)
                            (field "latency" (list u64))))
      (export $model "model" (type $model'))
      (type $pending' (record (field "id" u64) (field "arrival" u64) (field "deadline" u64)))
      (export $pending "pending" (type $pending'))
      (type $view' (record (field "now" u64) (field "worker" u32) (field "workers" u32) (field "load-qps" f64)
                           (field "loaded" (list u32)) (field "queue" (list $pending))))
      (export $view "view" (type $view'))
      (type $dispatch' (record (field "model" u32) (field "take" (list u32)) (field "drop" (list u32))))
      (export $dispatch "dispatch" (type $dispatch'))
      (type $decision' (variant (case "dispatch" $dispatch) (case "wait-until" u64) (case "idle")))
      (export $decision "decision" (type $decision'))
      (type $outcome' (record (field "model" u32) (field "size" u32) (field "started" u64) (field "finished" u64)
                              (field "missed" u32)))
      (export $outcome "outcome" (type $outcome'))
      (type $config' (record (field "app" string) (field "slo" u64) (field "workers" u32) (field "worker" u32)
                             (field "models" (list $model)) (field "params" string)))
      (export $config "config" (type $config'))
      (func $init (param "config" $config) (result (result (error string)))
        (canon lift (core func $i "init") (memory $mem) (realloc $realloc)))
      (export "init" (func $init))
      (func $decide (param "view" $view) (result $decision)
        (canon lift (core func $i "decide") (memory $mem) (realloc $realloc)))
      (export "decide" (func $decide))
      (func $observe (param "outcome" $outcome)
        (canon lift (core func $i "observe") (memory $mem) (realloc $realloc)))
      (export "observe" (func $observe)))"#;

    /// What [`ECHO`] answers for `view`.
    fn echo(view: &View) -> u64 {
        let mix = |h: u64, x: u64| h.wrapping_mul(1_000_003).wrapping_add(x);
        let mut h = view.now;
        for x in [view.worker.into(), view.workers.into(), view.load_qps.to_bits(), view.loaded.len() as u64] {
            h = mix(h, x);
        }
        h = view.loaded.iter().fold(h, |h, &id| mix(h, id.into()));
        h = mix(h, view.queue.len() as u64);
        view.queue.iter().fold(h, |h, p| mix(mix(mix(h, p.id), p.arrival), p.deadline))
    }

    fn view(depth: u64, seed: u64) -> View {
        // Values that use every byte of a `u64`, distinct per field and entry.
        let big = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
        View {
            now: big(1),
            worker: 3,
            workers: 7,
            load_qps: 123.456 + seed as f64,
            loaded: vec![0, 2, u32::MAX],
            queue: (0..depth)
                .map(|i| Pending { id: big(3 * i + 2), arrival: big(3 * i + 3), deadline: big(3 * i + 4) })
                .collect(),
        }
    }

    #[test]
    fn the_guest_receives_the_view_byte_for_byte_as_the_bindings_lower_it() {
        let engine: Arc<PolicyEngine> = PolicyEngine::with_cache(None).unwrap();
        let compiled = engine.compile("echo", ECHO.as_bytes()).expect("compile");
        let config = Config { app: "a".into(), slo: 1, workers: 7, worker: 3, models: vec![], params: "{}".into() };
        let binding = Binding::new(compiled, config, Limits::default());
        let mut instance = PolicyInstance::new(&engine, &binding, 3).expect("init");
        // Deep enough queues that the guest's memory grows under the list.
        for (depth, seed) in [(0, 0), (1, 1), (2, 2), (32, 3), (33, 4), (5_000, 5), (32, 6)] {
            let v = view(depth, seed);
            let want = Decision::WaitUntil(echo(&v));
            assert_eq!(instance.decide(&v), Ok(want.clone()), "depth {depth}");
            assert_eq!(instance.decide_via_bindings(&v), Ok(want), "depth {depth}, generated bindings");
        }
        // The hash tells the fields apart: a lowering that swapped two would answer
        // another instant.
        let v = view(32, 3);
        let mut swapped = v.clone();
        swapped.queue.iter_mut().for_each(|p| std::mem::swap(&mut p.arrival, &mut p.deadline));
        assert_ne!(instance.decide(&swapped), Ok(Decision::WaitUntil(echo(&v))));
    }
}
