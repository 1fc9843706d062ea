//! With the `torch` feature, keep libtorch_cuda linked: Rust links with `--as-needed`, which
//! drops it (nothing references it by symbol), and libtorch then sees no GPU (tch-rs #980).
//! `TRAINSIM_TORCH_CPU_ONLY=1` leaves it out, for a CPU-only libtorch or a machine without the
//! CUDA libraries it needs.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TRAINSIM_TORCH_CPU_ONLY");
    let cpu_only = std::env::var("TRAINSIM_TORCH_CPU_ONLY").is_ok_and(|v| v == "1");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_some() && !cpu_only {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
