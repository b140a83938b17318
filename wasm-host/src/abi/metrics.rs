//! `proxy_define_metric`, `proxy_increment_metric`, `proxy_record_metric`,
//! `proxy_get_metric`, with Envoy's semantics (see [`crate::metrics`]).

use wasmtime::{Caller, Linker};

use super::{HostResult, check_writable, fail, read, register, status, write_u32, write_u64};
use crate::metrics::{MetricError, MetricKind};
use crate::state::HostState;

pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    register!(linker, "env", "proxy_define_metric", define_metric, (kind: u32, name: u32, name_size: u32, id_ptr: u32));
    register!(linker, "env", "proxy_increment_metric", increment_metric, (id: u32, delta: i64));
    register!(linker, "env", "proxy_record_metric", record_metric, (id: u32, value: u64));
    register!(linker, "env", "proxy_get_metric", get_metric, (id: u32, value_ptr: u32));
    Ok(())
}

/// The two low bits of an id name its type; an unknown id of a type that cannot be
/// incremented or read is `BAD_ARGUMENT` rather than `NOT_FOUND`, as in Envoy.
fn unknown(id: u32) -> HostResult {
    if id & 3 <= 1 { fail(status::NOT_FOUND) } else { fail(status::BAD_ARGUMENT) }
}

fn refused(error: MetricError) -> HostResult {
    match error {
        MetricError::BadArgument => fail(status::BAD_ARGUMENT),
    }
}

fn define_metric(caller: &mut Caller<'_, HostState>, kind: u32, name: u32, name_size: u32, id_ptr: u32) -> HostResult {
    let name = read(caller, name, name_size)?;
    let Some(kind) = MetricKind::from_abi(kind) else {
        return fail(status::BAD_ARGUMENT);
    };
    check_writable(caller, id_ptr, 4)?;
    let metric = caller.data().shared.metrics.define(kind, &name);
    let id = caller.data_mut().vm.metric_ids.insert(metric);
    write_u32(caller, id_ptr, id)
}

fn increment_metric(caller: &mut Caller<'_, HostState>, id: u32, delta: i64) -> HostResult {
    match caller.data().vm.metric_ids.get(id) {
        Some(metric) => metric.increment(delta).or_else(refused),
        None => unknown(id),
    }
}

fn record_metric(caller: &mut Caller<'_, HostState>, id: u32, value: u64) -> HostResult {
    match caller.data().vm.metric_ids.get(id) {
        Some(metric) => {
            metric.record(value);
            Ok(())
        }
        None => fail(status::NOT_FOUND),
    }
}

fn get_metric(caller: &mut Caller<'_, HostState>, id: u32, value_ptr: u32) -> HostResult {
    let value = match caller.data().vm.metric_ids.get(id) {
        Some(metric) => match metric.get() {
            Ok(value) => value,
            Err(error) => return refused(error),
        },
        None => return unknown(id),
    };
    write_u64(caller, value_ptr, value)
}
