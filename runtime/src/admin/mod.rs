//! Policies while the application runs: the registry of loaded policies, and the admin API
//! (`valet-run --admin ADDR`) that uploads, activates and lists them, reads the stats, and
//! serves the `fs` commands on the running store (`fs ls|cat|rm|fsck|tenants|zones
//! --admin`).
//!
//! The API is HTTP on a loopback TCP address or a Unix socket. Every request must carry
//! `Authorization: Bearer TOKEN`, where TOKEN is written at start to a file that only the
//! user running `valet-run` can read; anything else gets 401.
//!
//! | request | effect |
//! | --- | --- |
//! | `PUT /policies/NAME` (body: module bytes) | validate, then load as NAME (201, or 400 with the reason; 507 once [`registry::MAX_POLICIES`] are loaded) |
//! | `DELETE /policies/NAME` | unload NAME (200; 404 if not loaded; 409 while a tenant uses it) |
//! | `PUT /tenants/TENANT/policy` (body: policy name) | make it TENANT's policy, atomically (200; 404 for a tenant the store does not have or a policy not loaded; 500 if it fails to load); the policy TENANT already runs is left running, its state kept |
//! | `POST /tenants/TENANT/rm` (body: `{"path": "/db", "recursive": true, "force": false}`) | remove files of TENANT and commit the removal (200 with what was removed; 409 while a guest of TENANT runs, unless forced; 404 for a tenant or path not there) |
//! | `GET /policies` | loaded policies: name, sha256, tenants using it |
//! | `GET /tenants` | every tenant: id, name, names and bytes its files hold, guests running |
//! | `GET /tenants/TENANT/ls?path=P&recursive=B` | `fs ls` of P, as text |
//! | `GET /tenants/TENANT/cat?path=P&offset=N&len=L` | up to L bytes of file P from N (at most 4 MiB) |
//! | `GET /fsck?deep=B` | fsck of the running store (deep: every live block verified), as JSON |
//! | `GET /zones` | `fs zones`, as text |
//! | `GET /stats` | the store's accounting (JSON) |
//!
//! A swap affects files opened after it; files already open keep the placement they were
//! opened with (the store decides per open).
//!
//! Three parts, one file each: [`registry`] (loaded policies, which tenant uses which),
//! [`server`] (the HTTP API over the registry) and [`client`] (what `valet-run policy
//! push|list` talk to it with).

pub mod client;
pub mod registry;
pub mod server;

pub use registry::{check_before_mount, PolicyInfo, Registry, RunningGuest, MAX_POLICIES};
pub use server::{start, write_token, AdminAddr, AdminServer};
