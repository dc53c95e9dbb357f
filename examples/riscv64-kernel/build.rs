//! Links the kernel with `link.ld` (load address 0x8020_0000 in QEMU virt
//! RAM, where OpenSBI's `fw_dynamic` jumps to the next stage).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rustc-link-arg-bins=-T{dir}/link.ld");
    println!("cargo:rerun-if-changed=link.ld");
}
