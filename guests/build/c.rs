//! Placeholder until this toolchain's guests land.

use crate::Ctx;

pub fn build(_ctx: &mut Ctx) {}
