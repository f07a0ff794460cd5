//! `containerd-shim-valet-v1`: the containerd shim of Valet (runtime type
//! `io.containerd.valet.v1`). See the crate docs in `lib.rs`.

use containerd_shimkit::sandbox::cli::shim_main;
use containerd_shimkit::{shim_version, Config};
use valet_shim::ValetInstance;

fn main() {
    let config = Config {
        // Our own messages are few; keep containerd's log free of dependencies' chatter.
        default_log_level: "info".to_string(),
        ..Default::default()
    };
    shim_main::<ValetInstance>("valet", shim_version!(), Some(config));
}
