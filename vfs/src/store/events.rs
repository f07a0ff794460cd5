//! Placement events queued under the store's lock and delivered after it is released, so a
//! policy that takes its time delays only the call that produced the event.

use crate::hint::{FileEvent, Hint, Placement};

use super::state::TenantId;

/// An owned [`FileEvent`].
pub(super) enum Event {
    Written {
        tenant: TenantId,
        path: String,
        bytes: u64,
    },
    Synced {
        tenant: TenantId,
        path: String,
    },
    Closed {
        tenant: TenantId,
        path: String,
        size: u64,
    },
    Deleted {
        tenant: TenantId,
        path: String,
        hint: Hint,
        lifetime_bytes: u64,
        lifetime_secs: f64,
    },
}

impl Event {
    pub fn tenant(&self) -> TenantId {
        match self {
            Event::Written { tenant, .. }
            | Event::Synced { tenant, .. }
            | Event::Closed { tenant, .. }
            | Event::Deleted { tenant, .. } => *tenant,
        }
    }

    pub fn deliver(&self, placement: &dyn Placement) {
        let event = match self {
            Event::Written {
                tenant,
                path,
                bytes,
            } => FileEvent::Written {
                tenant: *tenant,
                path,
                bytes: *bytes,
            },
            Event::Synced { tenant, path } => FileEvent::Synced {
                tenant: *tenant,
                path,
            },
            Event::Closed { tenant, path, size } => FileEvent::Closed {
                tenant: *tenant,
                path,
                size: *size,
            },
            Event::Deleted {
                tenant,
                path,
                hint,
                lifetime_bytes,
                lifetime_secs,
            } => FileEvent::Deleted {
                tenant: *tenant,
                path,
                hint: *hint,
                lifetime_bytes: *lifetime_bytes,
                lifetime_secs: *lifetime_secs,
            },
        };
        placement.event(&event);
    }
}
