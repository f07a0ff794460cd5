//! The built-in placement policies, as WebAssembly modules embedded by name.
//!
//! Each crate in `builtin/` is an ordinary policy written with the SDK (`sdk/`), compiled
//! for `wasm32-unknown-unknown` by this crate's build script; `valet-run --policy NAME`
//! loads them exactly as it loads a policy file, through the same checks and sandbox.

include!(concat!(env!("OUT_DIR"), "/builtin.rs"));

/// The module of the built-in policy `name`.
pub fn builtin(name: &str) -> Option<&'static [u8]> {
    BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, m)| *m)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_builtin_is_a_wasm_module() {
        let names: Vec<_> = super::BUILTIN.iter().map(|(n, _)| *n).collect();
        for expected in [
            "cachelib",
            "default",
            "fdp-dirs",
            "learn",
            "one-stream",
            "rocks",
        ] {
            assert!(
                names.contains(&expected),
                "{expected} missing from {names:?}"
            );
        }
        for (name, module) in super::BUILTIN {
            assert!(module.starts_with(b"\0asm"), "{name}");
        }
    }
}
