//! `proxy_get_current_time_nanoseconds` and `proxy_set_tick_period_milliseconds`.

use wasmtime::{Caller, Linker};

use super::{HostResult, register, write_u64};
use crate::state::HostState;

pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    register!(linker, "env", "proxy_get_current_time_nanoseconds", current_time, (time_ptr: u32));
    register!(linker, "env", "proxy_set_tick_period_milliseconds", set_tick_period, (period_ms: u32));
    Ok(())
}

fn current_time(caller: &mut Caller<'_, HostState>, time_ptr: u32) -> HostResult {
    let now = caller.data().shared.clock.realtime_nanos();
    write_u64(caller, time_ptr, now)
}

/// Sets the tick period of the calling context's root context. As in Envoy, every call
/// re-arms the timer to fire one period from now; 0 stops it.
fn set_tick_period(caller: &mut Caller<'_, HostState>, period_ms: u32) -> HostResult {
    let now = caller.data().shared.clock.monotonic_nanos();
    let vm = &mut caller.data_mut().vm;
    let Some(root) = vm.root_of(vm.acting_context()) else {
        return Ok(());
    };
    if let Some(root) = vm.roots.get_mut(&root) {
        let period = u64::from(period_ms) * 1_000_000;
        root.tick_period = (period > 0).then_some(period);
        root.next_tick = (period > 0).then(|| now.saturating_add(period));
    }
    Ok(())
}
