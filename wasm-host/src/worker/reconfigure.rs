//! A new plugin configuration on a running VM, as an xDS update: a new root context
//! (same VM, same `vm_id`, shared data kept) takes the new streams once every worker has
//! accepted it; the old root finishes (`proxy_on_done`, `proxy_on_delete`) when its last
//! stream does. A configuration any worker rejects is abandoned on all of them.

use std::sync::Arc;

use super::{Invoked, Worker};
use crate::error::HostError;
use crate::state::{Callback, Delivery, Plugin};

impl Worker {
    /// Starts a root context for a new configuration without switching to it yet.
    pub(crate) fn prepare_configuration(&mut self, plugin: Arc<Plugin>) -> Result<u32, HostError> {
        if self.failed {
            // A failed VM takes the configuration when (if) it restarts.
            return Ok(0);
        }
        self.start_root(plugin)
    }

    /// Switches new streams to the prepared root; the old root finishes with its
    /// streams.
    pub(crate) fn commit_configuration(&mut self, root: u32, plugin: Arc<Plugin>) {
        self.plugin = plugin;
        if root == 0 {
            return;
        }
        let old = std::mem::replace(&mut self.root, root);
        if let Some(context) = self.store.data_mut().vm.roots.get_mut(&old) {
            context.retiring = true;
        }
        self.maybe_retire_root(old);
    }

    /// Drops a prepared root after another worker rejected the configuration.
    pub(crate) fn abandon_configuration(&mut self, root: u32) {
        if root != 0 {
            self.finish_root(root);
        }
    }

    pub(super) fn maybe_retire_root(&mut self, root: u32) {
        let vm = &self.store.data().vm;
        let retiring = vm.roots.get(&root).is_some_and(|r| r.retiring);
        if retiring && !vm.streams.values().any(|s| s.root == root) {
            self.finish_root(root);
        }
    }

    /// `proxy_on_done` and `proxy_on_delete` for a root context; its ticks and callouts
    /// die with it.
    pub(super) fn finish_root(&mut self, root: u32) {
        let on_done = self.exports.on_done.clone();
        if !matches!(self.invoke(Callback::Done, root, &on_done, root), Invoked::Trapped) {
            let on_delete = self.exports.on_delete.clone();
            let _ = self.invoke(Callback::Delete, root, &on_delete, root);
        }
        let vm = &mut self.store.data_mut().vm;
        vm.roots.remove(&root);
        vm.callouts.retain(|_, callout| {
            let keep = callout.root != root;
            if !keep && let Delivery::InFlight { task, .. } = &callout.delivery {
                task.abort();
            }
            keep
        });
        vm.deferred.clear();
    }
}
