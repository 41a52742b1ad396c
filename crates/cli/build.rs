//! Links the `snapdiff` command as a position-dependent executable on Linux.
//!
//! A position-independent one has ~40,000 relocations that the loader
//! applies at every start, writing ~150 pages before `main`: 0.4 ms of a
//! 2 ms start, which `check` and `fleet` of one small dump pay every time
//! (see docs/performance.md). Code compiled position-independent links into
//! a fixed-address executable as it is; the heap, the stack and the shared
//! libraries are still placed at random, and the readers are safe Rust.

fn main() {
    println!("cargo:rerun-if-changed=crates/cli/build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
}
